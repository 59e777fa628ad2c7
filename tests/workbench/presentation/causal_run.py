"""The causal probes' run folder, built once per session: what the analyses write for a tiny untrained
EWT encoder (head roles, gating, amnesic probing, structural probes), read by
tests/workbench/presentation/test_causal_faces.py and tests/apps/test_causal_page.py."""

from __future__ import annotations

import time
from pathlib import Path

import torch

import plmodels
from plmodels.checkpoint import build_model
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from workbench.analyses.amnesic import amnesic_model
from workbench.analyses.gating import gate_model
from workbench.analyses.heads import analyse_heads
from workbench.analyses.probing import probe_model
from workbench.data.tasks import ud_sentences

_BUILT: dict[str, Path] = {}


def build_causal_run(run: Path) -> Path:
    """A run folder holding what the analyses write for a tiny untrained EWT encoder (test_gating's
    model): heads_classes, gating, head_passport, amnesic and structural probing rows (two seeds)."""
    texts = [" ".join(s.words) for s in ud_sentences("ewt", "train")[:400]]
    tok = Tokenizer.train_wordpiece(texts, 400)
    torch.manual_seed(0)
    fields = {**preset("encoder", "tiny"), "vocab_size": tok.vocab_size, "dropout": 0.0, "pad_token_id": tok.pad_id}
    path = run / "models" / "tiny"
    plmodels.save(build_model("encoder", fields), tok, path)
    # small configs; C = 0.05 makes the L-BFGS probes converge in a few iterations (the budget is ~60 s)
    analyse_heads(path, out_dir=run / "heads", run_dir=run, config=dict(max_sentences=40, n_boot=50), progress=False)
    gate_model(path, out_dir=run, progress=False, config=dict(tasks=["pos", "ner"], random_draws=2, max_train_targets=500,
                                                              lm_sentences=16, batch_size=12, C=0.05))
    amnesic_model(path, out_dir=run, progress=False, config=dict(
        tasks=["pos"], layers=[0, 2], erasers=["leace"], max_train_targets=500, max_eval_targets=300,
        lm_sentences=16, C=0.05, draws=2))
    probe_model(path, tasks=["structural_distance", "structural_depth"], out_dir=run / "probe", run_dir=run,
                progress=False, config=dict(seeds=[0, 1], max_train_targets=500, max_eval_targets=300, n_boot=0,
                                            modes=["single"]))
    return run


def causal_run(tmp_path_factory) -> Path:
    """The run of `build_causal_run`, built once per session (prints how long it took)."""
    if "run" not in _BUILT:
        t0 = time.perf_counter()
        _BUILT["run"] = build_causal_run(tmp_path_factory.mktemp("causal") / "causal")
        print(f"causal run built in {time.perf_counter() - t0:.1f} s")
    return _BUILT["run"]
