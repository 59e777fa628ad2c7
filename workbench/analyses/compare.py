"""Compare two checkpoints layer by layer and head by head (e.g. a finetuned model vs its base).

After Merchant, Rahimtoroghi, Pavlick & Tenney (2020), "What Happens To BERT Embeddings During
Fine-tuning?": representational similarity per layer with CKA (Kornblith et al. 2019, linear and
RBF; `probes.cka`), attention change per head as the Jensen-Shannon divergence between the two
models' word-level attention on the same sentences (Kovaleva et al. 2019 style;
`probes.head_similarity`), and edge-probing scores of B next to A (Tenney et al. 2019;
`workbench.analyses.probing.probe_model`).

`compare_models(a, b, out_dir, config)` returns
- `cka` (model_a, model_b, layer_a, layer_b, kind, value): the full layer x layer matrix for each
  kind; the per-layer similarity is its diagonal. Kinds: "linear" (exact, feature space, any n),
  "linear_mb" (debiased minibatch estimator of Nguyen et al. 2021), "rbf" (on a word subsample);
- `head_change` (model_a, model_b, layer, head, metric, value): metric "js" (mean JSD in nats over
  words), plus "importance_delta:<method>" (B minus A) when the run holds both models' importance
  and "role_changed" (1 when the head's primary role differs) when head roles are available;
- `probing_change` (model_a, model_b, task, layer, metric, value_a, value_b, delta).
Both models must share a tokenizer (same fingerprint): CKA and JS compare the same words.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

import plmodels
from plmodels.config import Config
from plmodels.progress import write
from probes.cka import MinibatchCKA, cka_frame, cka_matrix
from probes.head_similarity import head_change_frame, js_divergence_per_head
from probes.heads import weighting_rows
from workbench.analyses.heads import analyse_heads
from workbench.analyses.probing import ProbeRunConfig, default_model_name, probe_model
from workbench.core.io import atomic_write_json
from workbench.core.results import write_table
from workbench.store import extract, load_sentences

CKA_KINDS = ("linear", "linear_mb", "rbf")
PROBING_CHANGE_COLUMNS = ["model_a", "model_b", "task", "layer", "metric", "value_a", "value_b", "delta"]


@dataclass(frozen=True)
class CompareRunConfig(Config):
    """A comparison run. The defaults here are the canonical values (configs/compare.json is a copy
    of them to edit and pass with --config); unknown keys and wrong types are errors."""

    data: str = "ewt:dev"                  # sentences (workbench.store.load_sentences)
    max_sentences: int | None = 500        # first N sentences (None = all)
    pooling: str = "mean"                  # subword -> word pooling in the store
    cka_kinds: tuple[str, ...] = ("linear", "rbf")
    minibatch_size: int = 1000             # words per minibatch for "linear_mb"
    rbf_max_words: int = 2000              # random word subsample for "rbf" (n x n Grams)
    rbf_sigma_frac: float = 0.5
    seed: int = 0                          # subsample / minibatch order
    head_change: bool = True               # JS divergence per head (needs word attention)
    attn_max_sentences: int | None = 200   # sentences used for JS (attention maps are n^2 per head)
    head_roles: bool = False               # run the head analysis on both models when the run has no roles
    head_roles_max_sentences: int = 200
    probing_tasks: tuple[str, ...] = ("pos", "deps")   # [] = no probing change
    probe_config: str | None = None        # a probe.json (None: ProbeRunConfig's defaults) ...
    probe_overrides: dict = field(default_factory=lambda: {
        "modes": ["single"], "seeds": [0], "max_train_targets": 2000, "max_eval_targets": 1000, "n_boot": 0})
    batch_tokens: int = 8192

    def __post_init__(self) -> None:
        for name in ("cka_kinds", "probing_tasks"):
            v = getattr(self, name)
            if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)):
                raise ValueError(f"CompareRunConfig.{name} must be a list, got {v!r}")
            object.__setattr__(self, name, tuple(v))
        bad = [k for k in self.cka_kinds if k not in CKA_KINDS]
        if bad:
            raise ValueError(f"CompareRunConfig.cka_kinds: unknown {bad}; choose from {list(CKA_KINDS)}")
        for name in ("minibatch_size", "rbf_max_words", "head_roles_max_sentences", "batch_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 4:
                raise ValueError(f"CompareRunConfig.{name} must be an int >= 4, got {getattr(self, name)!r}")
        for name in ("max_sentences", "attn_max_sentences"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"CompareRunConfig.{name} must be a positive int or null, got {v!r}")

def _say(progress: bool, msg: str) -> None:
    if progress:
        write(f"[compare] {msg}")


# --------------------------------------------------------------------------------------- CKA
def layer_cka(layers_a: Sequence[np.ndarray], layers_b: Sequence[np.ndarray], kind: str,
              cfg: CompareRunConfig) -> np.ndarray:
    """(La, Lb) CKA between every layer of a and of b (each a list of (n_words, d) arrays)."""
    n = len(layers_a[0])
    if kind == "linear":
        return cka_matrix([np.asarray(x, dtype=np.float32) for x in layers_a],
                          [np.asarray(x, dtype=np.float32) for x in layers_b], kind="linear")
    rng = np.random.default_rng(cfg.seed)
    if kind == "rbf":
        idx = np.sort(rng.permutation(n)[: cfg.rbf_max_words])
        return cka_matrix([np.asarray(x[idx], dtype=np.float64) for x in layers_a],
                          [np.asarray(x[idx], dtype=np.float64) for x in layers_b], kind="rbf",
                          sigma_frac=cfg.rbf_sigma_frac)
    acc = MinibatchCKA()
    order = rng.permutation(n)
    for i in range(0, n - cfg.minibatch_size + 1, cfg.minibatch_size):  # a ragged tail is left out
        idx = np.sort(order[i:i + cfg.minibatch_size])
        acc.update([np.asarray(x[idx], dtype=np.float64) for x in layers_a],
                   [np.asarray(x[idx], dtype=np.float64) for x in layers_b])
    if acc.n_batches_ == 0:
        raise ValueError(f"linear_mb: {n} words is fewer than one minibatch of {cfg.minibatch_size}")
    return acc.finalize()


# ------------------------------------------------------------------------------- head change
def _table_rows(run_dir: Path | None, name: str) -> pd.DataFrame | None:
    if run_dir is None:
        return None
    p = Path(run_dir) / "tables" / f"{name}.parquet"
    return pd.read_parquet(p) if p.exists() else None


def importance_delta(imp: pd.DataFrame | None, a: str, b: str) -> pd.DataFrame:
    """head_change rows "importance_delta:<method>" = importance in b minus in a, per head."""
    cols = ["model_a", "model_b", "layer", "head", "metric", "value"]
    if imp is None or not {a, b} <= set(imp["model"]):
        return pd.DataFrame(columns=cols)
    wide = imp[imp.model.isin([a, b])].pivot_table(index=["method", "layer", "head"], columns="model",
                                                   values="value").dropna().reset_index()
    return pd.DataFrame({"model_a": a, "model_b": b, "layer": wide["layer"], "head": wide["head"],
                         "metric": "importance_delta:" + wide["method"], "value": wide[b] - wide[a]})[cols]


def role_change(classes: pd.DataFrame | None, a: str, b: str) -> pd.DataFrame:
    """head_change rows "role_changed": 1.0 when a head's primary role differs between a and b."""
    cols = ["model_a", "model_b", "layer", "head", "metric", "value"]
    if classes is None or not {a, b} <= set(classes["model"]):
        return pd.DataFrame(columns=cols)
    c = classes[classes["primary"]] if "primary" in classes.columns else classes
    ra = c[c.model == a].groupby(["layer", "head"])["role"].first()
    rb = c[c.model == b].groupby(["layer", "head"])["role"].first()
    both = pd.concat([ra.rename("a"), rb.rename("b")], axis=1).dropna().reset_index()
    return pd.DataFrame({"model_a": a, "model_b": b, "layer": both["layer"], "head": both["head"],
                         "metric": "role_changed", "value": (both["a"] != both["b"]).astype(float)})[cols]


# ---------------------------------------------------------------------------- probing change
def probing_change(pa: Path, pb: Path, names: tuple[str, str], cfg: CompareRunConfig, out_dir: Path | None,
                   tasks_dir, store_root, progress: bool) -> pd.DataFrame:
    """Edge-probing scores of b next to a per task and layer (mean over the probe seeds)."""

    base = ProbeRunConfig.load(cfg.probe_config) if cfg.probe_config else ProbeRunConfig()
    pcfg = ProbeRunConfig.from_dict({**base.to_dict(), **cfg.probe_overrides, "tasks": list(cfg.probing_tasks)},
                                    "CompareRunConfig.probe_overrides")
    scores = []
    for path, name in zip((pa, pb), names):
        sub = None if out_dir is None else out_dir / "probe" / name
        t = probe_model(path, tasks=cfg.probing_tasks, out_dir=sub, config=pcfg, model_name=name,
                        store_root=store_root or (out_dir / "store" if out_dir else None), tasks_dir=tasks_dir,
                        progress=progress)["probing"]
        t = t[(t["mode"] == "single") & (t["seed"] >= 0)]
        scores.append(t.groupby(["task", "layer", "metric"])["value"].mean().rename(name))
    both = pd.concat(scores, axis=1).dropna().reset_index()
    a, b = names
    return pd.DataFrame({"model_a": a, "model_b": b, "task": both["task"], "layer": both["layer"],
                         "metric": both["metric"], "value_a": both[a], "value_b": both[b],
                         "delta": both[b] - both[a]})[PROBING_CHANGE_COLUMNS]


# ------------------------------------------------------------------------------------- entry
def only_adds_specials(small, big) -> bool:
    """True when `big` is `small` plus special tokens at new ids (a T5 run adds its sentinels to the
    tokenizer it shares with the other systems): both split every text into the same ids."""
    if (small.kind, small.lowercase, small.specials) != (big.kind, big.lowercase, big.specials):
        return False
    vs, vb = small.hf.get_vocab(with_added_tokens=True), big.hf.get_vocab(with_added_tokens=True)
    if any(vb.get(t) != i for t, i in vs.items()):
        return False
    added = {t.content: t.special for t in big.hf.get_added_tokens_decoder().values()}
    return all(added.get(t, False) for t in vb.keys() - vs.keys())


def check_same_tokenizer(tok_a, tok_b, pa, pb) -> None:
    """ValueError unless both checkpoints split text the same way (CKA / JS need the same words): the
    same tokenizer, or one that only adds special tokens to the other (T5's sentinels)."""
    if tok_a is None or tok_b is None:
        raise ValueError(f"compare: {pa if tok_a is None else pb} has no tokenizer/ folder")
    small, big = sorted((tok_a, tok_b), key=lambda t: t.vocab_size)
    if tok_a.fingerprint() != tok_b.fingerprint() and not only_adds_specials(small, big):
        raise ValueError(
            f"compare: {pa} and {pb} use different tokenizers ({tok_a.fingerprint()[:12]}... vs "
            f"{tok_b.fingerprint()[:12]}...); CKA and attention JS need both models on the same tokens. "
            "Compare a finetuned model with its own base, or two models trained with one tokenizer.")


def _attention_items(store):
    """(word attention (L, H, n, n), special shares (L, H, n, K)) per sentence of a store."""
    for s in range(store.n_sentences):
        yield store.sentence_attention(s), store.sentence_special(s)


def compare_loaded(model_a, model_b, tok, sentences: Sequence[Sequence[str]], names: tuple[str, str],
                   cfg: CompareRunConfig, store_root: str | Path, ids: tuple[str | None, str | None] = (None, None),
                   progress: bool = False) -> dict[str, pd.DataFrame]:
    """`cka` and `head_change` ("js") tables for two models in memory on the same sentences."""

    a, b = names
    kw = dict(pooling=cfg.pooling, batch_tokens=cfg.batch_tokens, progress=progress,
              key_extra=f"compare:{len(sentences)}")
    sa = extract(model_a, tok, sentences, store_root, model_id=ids[0], **kw)
    sb = extract(model_b, tok, sentences, store_root, model_id=ids[1], **kw)
    la = [sa.layer(l) for l in range(sa.n_layers)]
    lb = [sb.layer(l) for l in range(sb.n_layers)]
    frames = []
    for kind in cfg.cka_kinds:
        t0 = time.perf_counter()
        frames.append(cka_frame(layer_cka(la, lb, kind, cfg), a, b, kind=kind))
        _say(progress, f"{a} vs {b}: {kind} CKA over {sa.n_words} words in {time.perf_counter() - t0:.1f} s")
    tables = {"cka": pd.concat(frames, ignore_index=True)}
    if cfg.head_change:
        sub = list(sentences[: cfg.attn_max_sentences]) if cfg.attn_max_sentences else list(sentences)
        kw_attn = {**kw, "key_extra": f"compare-attn:{len(sub)}"}
        xa = extract(model_a, tok, sub, store_root, model_id=ids[0], attentions=True, **kw_attn)
        xb = extract(model_b, tok, sub, store_root, model_id=ids[1], attentions=True, **kw_attn)
        js = js_divergence_per_head(_attention_items(xa), _attention_items(xb))
        tables["head_change"] = head_change_frame(js, a, b, metric="js")
    return tables


def compare_models(path_a: str | Path, path_b: str | Path, out_dir: str | Path | None = None,
                   config: "CompareRunConfig | Mapping | str | Path | None" = None,
                   names: tuple[str, str] | None = None, tasks_dir: str | Path | None = None,
                   store_root: str | Path | None = None, run_dir: str | Path | None = None,
                   progress: bool = True) -> dict[str, pd.DataFrame]:
    """Compare checkpoint b with checkpoint a -> {"cka", "head_change"[, "probing_change"]}.

    Stores go to `store_root` (default out_dir/store). Importance and head roles are looked up in
    `run_dir` (default: the run holding out_dir, i.e. out_dir/../..). With out_dir, tables are also
    written to out_dir/tables and the resolved config to out_dir/compare_run.json.
    """

    cfg = CompareRunConfig.resolve(config)
    pa, pb = Path(path_a), Path(path_b)
    names = tuple(names) if names else (default_model_name(pa), default_model_name(pb))
    if names[0] == names[1]:
        names = (names[0], names[1] + "_b")
    out = Path(out_dir) if out_dir is not None else None
    if store_root is None:
        if out is None:
            raise ValueError("compare_models: give out_dir or store_root (where the activation stores go)")
        store_root = out / "store"
    if run_dir is None and out is not None and out.parent.name == "compare":
        run_dir = out.parent.parent
    t0 = time.perf_counter()
    model_a, tok_a = plmodels.load(pa)
    model_b, tok_b = plmodels.load(pb)
    check_same_tokenizer(tok_a, tok_b, pa, pb)
    sentences = load_sentences(cfg.data, cfg.max_sentences)
    tables = compare_loaded(model_a, model_b, tok_a, sentences, names, cfg, store_root,
                            (plmodels.checkpoint_hash(pa), plmodels.checkpoint_hash(pb)), progress)
    extra = [importance_delta(_table_rows(run_dir, "importance"), *names)]
    classes = _table_rows(run_dir, "heads_classes")
    classes = None if classes is None else weighting_rows(classes)  # roles of raw attention (old tables: all raw)
    if (classes is None or not set(names) <= set(classes["model"])) and cfg.head_roles:
        hcfg = {"max_sentences": cfg.head_roles_max_sentences, "n_boot": 0}
        classes = pd.concat([analyse_heads(p, out_dir=(out / "heads" / n) if out else None, config=hcfg,
                                           model_name=n, store_root=store_root, progress=progress)["heads_classes"]
                             for p, n in zip((pa, pb), names)], ignore_index=True)
    extra.append(role_change(classes, *names))
    if "head_change" in tables:
        tables["head_change"] = pd.concat([tables["head_change"], *[e for e in extra if len(e)]], ignore_index=True)
    if cfg.probing_tasks:
        tables["probing_change"] = probing_change(pa, pb, names, cfg, out, tasks_dir, store_root, progress)
    if out is not None:
        for tname, df in tables.items():
            write_table(out, tname, df)
        atomic_write_json(out / "compare_run.json", {
            "model_a": names[0], "model_b": names[1], "path_a": str(pa), "path_b": str(pb),
            "config": cfg.to_dict(), "n_sentences": len(sentences), "seconds": round(time.perf_counter() - t0, 1)})
    return tables
