"""A small results folder for the app tests: every table of docs/design.md, schema-exact.

`make_results_fixture(root)` writes one run ("demo") whose tables describe a frozen model and its
finetuned copy (`enc` and `enc-ft`, `n_layers` x `n_heads`), with *planted* values the tests can
check (e.g. the pos task peaks at layer 3, head (2, 5) is the best `nsubj` head). With
`checkpoints=True` it also saves two tiny real checkpoints (`tiny-enc`, `tiny-dec`) and a real
word-level attention store for `tiny-enc`, for the Playground and the sentence view.

When the real pipeline (workbench/pipeline.py) exists, this function is the one place to swap in
its output on a `tiny` model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.core.results import write_table

TASKS = ("pos", "deps", "ner")
PEAK_LAYER = {"pos": 3, "deps": 6, "ner": 9}      # planted: score peaks here (12-layer scale)
MODELS = ("enc", "enc-ft")
ROLES = ("positional", "syntactic", "sink", "broad", "none")
RELATIONS = ("nsubj", "obj", "amod")
BEST_HEAD = {"nsubj": (2, 5), "obj": (4, 1), "amod": (1, 0)}
SENTENCES = [
    "the cat sat on the mat .".split(),
    "a dog chased the red ball across the garden .".split(),
    "she reads books in the quiet library every evening .".split(),
]


def _peak(layers: np.ndarray, task: str, n_layers: int) -> np.ndarray:
    p = PEAK_LAYER[task] * n_layers / 12
    return 0.9 - 0.03 * np.abs(layers - p)


def _probing(n_layers: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    rows, summary, mix = [], [], []
    layers = np.arange(n_layers + 1)
    for model in MODELS:
        shift = 0.02 if model == "enc-ft" else 0.0
        for task in TASKS:
            scores = _peak(layers, task, n_layers) + shift
            for seed in (0, 1, -1):
                for mode, vals in (("single", scores), ("cumulative", np.maximum.accumulate(scores)),
                                   ("control", scores - 0.3)):
                    for l, v in zip(layers, vals):
                        rows.append((model, task, "mlp", "first", int(l), mode, "accuracy", float(v), seed,
                                     float(v) - 0.01, float(v) + 0.01))
                rows.append((model, task, "mlp", "first", -1, "mix", "accuracy", float(scores.max()) + 0.01,
                             seed, float(scores.max()), float(scores.max()) + 0.02))
            w = np.exp(-0.5 * (layers - PEAK_LAYER[task] * n_layers / 12) ** 2)
            w /= w.sum()
            mix += [(model, task, int(l), float(x), 0) for l, x in zip(layers, w)]
            summary += [(model, task, "expected_layer", float((w * layers).sum())),
                        (model, task, "center_of_gravity", PEAK_LAYER[task] * n_layers / 12 - 0.5),
                        (model, task, "selectivity", 0.3)]
    probing = pd.DataFrame(rows, columns=["model", "task", "probe", "pooling", "layer", "mode", "metric",
                                          "value", "seed", "ci_low", "ci_high"])
    return (probing,
            pd.DataFrame(summary, columns=["model", "task", "metric", "value"]),
            pd.DataFrame(mix, columns=["model", "task", "layer", "weight", "seed"]))


def _heads(n_layers: int, n_heads: int) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(0)
    L, H = np.divmod(np.arange(n_layers * n_heads), n_heads)
    heads, classes, importance, change, relations, similarity = [], [], [], [], [], []
    for model in MODELS:
        similarity.append(pd.DataFrame({"model": model, "layer": L, "head": H, "x": rng.normal(size=L.size),
                                        "y": rng.normal(size=L.size)}))
        for score in ("entropy", "prev_token"):
            v = rng.uniform(0, 0.9, L.size)
            if score == "prev_token":
                v[(L == 0) & (H == 1)] = 0.99                    # planted previous-token head
            heads.append(pd.DataFrame({"model": model, "layer": L, "head": H, "score": score, "value": v}))
        roles = [ROLES[(l + h) % len(ROLES)] for l, h in zip(L, H)]
        classes.append(pd.DataFrame({"model": model, "layer": L, "head": H, "role": roles, "primary": True}))
        for method in ("michel", "ablation"):
            importance.append(pd.DataFrame({"model": model, "method": method, "layer": L, "head": H,
                                            "value": rng.uniform(0, 1, L.size)}))
        for rel, (bl, bh) in BEST_HEAD.items():
            relations.append((model, rel, "dependent->head", bl, bh, 0.8, 0.78, 0.75, 0.81, -1, 0.4))
    change = pd.DataFrame({"model_a": "enc", "model_b": "enc-ft", "layer": L, "head": H,
                           "metric": "js_divergence", "value": L / max(n_layers - 1, 1) * 0.5})
    return {
        "heads": pd.concat(heads, ignore_index=True),
        "heads_classes": pd.concat(classes, ignore_index=True),
        "head_similarity": pd.concat(similarity, ignore_index=True),
        "importance": pd.concat(importance, ignore_index=True),
        "head_change": change,
        "relations": pd.DataFrame(relations, columns=[
            "model", "relation", "direction", "best_layer", "best_head", "dev_acc", "test_acc",
            "ci_low", "ci_high", "baseline_offset", "baseline_acc"]),
    }


def _pruning_and_compare(n_layers: int) -> dict[str, pd.DataFrame]:
    rows = []
    for method, slope in (("michel", 0.2), ("ablation", 0.3), ("random", 0.6)):
        for seed in (0, 1):
            for f in np.linspace(0, 0.9, 10):
                rows.append(("enc", method, float(f), "accuracy", 0.9 - slope * f ** 2, seed))
    pruning = pd.DataFrame(rows, columns=["model", "method", "fraction", "metric", "value", "seed"])
    speed = pd.DataFrame({"model": "enc", "variant": ["full", "pruned-50%"], "params": [1000, 700],
                          "bytes": [4000, 2800], "tokens_per_s": [100.0, 140.0]})
    la, lb = np.meshgrid(np.arange(n_layers + 1), np.arange(n_layers + 1), indexing="ij")
    cka = pd.DataFrame({"model_a": "enc", "model_b": "enc-ft", "layer_a": la.ravel(), "layer_b": lb.ravel(),
                        "kind": "linear", "value": np.exp(-np.abs(la - lb).ravel() / 3.0) - 0.02 * la.ravel() * (la == lb).ravel()})
    fvf = []
    for task in ("sst2", "pos"):
        for setting, v in (("frozen", 0.7), ("finetuned", 0.9)):
            fvf.append(("enc", task, setting, "accuracy", v, 0, v - 0.02, v + 0.02))
    fvf = pd.DataFrame(fvf, columns=["model", "task", "setting", "metric", "value", "seed", "ci_low", "ci_high"])
    kendall = pd.DataFrame({"model": "enc", "method_a": ["michel"], "method_b": ["ablation"], "tau": [0.4]})
    return {"pruning": pruning, "pruned_speed": speed, "cka": cka, "frozen_vs_finetuned": fvf,
            "kendall": kendall}


def _training() -> pd.DataFrame:
    steps = np.arange(0, 1000, 100)
    rows = [("enc", int(s), int(s) * 512, split, "loss", float(8 * np.exp(-s / 400) + 2 + (split == "dev") * 0.1))
            for split in ("train", "dev") for s in steps]
    return pd.DataFrame(rows, columns=["model", "step", "tokens", "split", "metric", "value"])


def _checkpoints(run: Path) -> None:
    """Two tiny real checkpoints and a real word-level attention store for tiny-enc."""
    import torch

    import plmodels
    from plmodels import Decoder, DecoderConfig, Encoder, EncoderConfig
    from plmodels.tokenizer import Tokenizer
    from workbench.store import extract

    texts = [" ".join(s) for s in SENTENCES] * 4
    torch.manual_seed(0)
    tiny = dict(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_positions=64)
    wp = Tokenizer.train_wordpiece(texts, vocab_size=120)
    enc = Encoder(EncoderConfig(vocab_size=wp.vocab_size, **tiny)).eval()
    plmodels.save(enc, wp, run / "models" / "tiny-enc", card={"data": "fixture", "steps": 0})
    bpe = Tokenizer.train_bpe(texts, vocab_size=300)
    dec = Decoder(DecoderConfig(vocab_size=bpe.vocab_size, **tiny)).eval()
    plmodels.save(dec, bpe, run / "models" / "tiny-dec", card={"data": "fixture", "steps": 0})
    store_dir = run / "attention" / "tiny-enc"
    extract(enc, wp, SENTENCES, store_dir, attentions=True, progress=False, model_id="tiny-enc")
    (store_dir / "sentences.json").write_text(json.dumps(SENTENCES))


def make_results_fixture(root: str | Path, n_layers: int = 12, n_heads: int = 12,
                         checkpoints: bool = True, run: str = "demo") -> Path:
    """Write a results root with one run `run`; returns the run folder."""
    run_dir = Path(root) / run
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({
        "config": {"name": run, "models": list(MODELS)}, "seed": 0, "code_version": "fixture",
        "data_checksums": {}, "steps": {"probe": "done", "heads": "done", "prune": "done"}}))
    probing, summary, mix = _probing(n_layers)
    tables = {"probing": probing, "probing_summary": summary, "mix_weights": mix, "training": _training(),
              **_heads(n_layers, n_heads), **_pruning_and_compare(n_layers)}
    for name, df in tables.items():
        write_table(run_dir, name, df)
    if checkpoints:
        _checkpoints(run_dir)
    return run_dir


APP = str(Path(__file__).resolve().parents[2] / "apps" / "app.py")


def app_page(monkeypatch, root: Path, page: str):
    """The app under Streamlit's AppTest on the results folder `root`, switched to `page`
    ("app_pages/causal.py", ...) and run: the page as the app draws it."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("WORKBENCH_RESULTS", str(root))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page(page)
    at.run()
    return at
