"""The flow suite's speed (issue 78: one mini checkpoint's suite, 200 sentences, <= 3 minutes on this
CPU): each stage's batched form paired against the per-sentence path it replaced (commit c9eee1b), in
this process, on the same sentences, with the largest difference of their numbers; then the whole
suite (`workbench.analyses.flow.flow_model`) at the issue's settings, its seconds per stage.

Paired units, interleaved round by round (old, new, old, ...), median of the rounds:
- attribution of one sentence (`_attributions` + the faithfulness pass): the old path ran every forward
  with the (B, T, V) LM logits, value zeroing one forward per layer, leave-one-out and each method's
  deletion curve as separate forwards, and attention flow on the whole ((L+1) T)-node graph;
- the k-means MI of one layer with its shuffled control: the old path clustered twice, with the
  BLAS/OpenMP pools at their default size;
- the tuned lens' training: the old path trained one layer after the other, Adam over the readout's
  gradients too.

    python benchmarks/bench_flow.py MODEL [--threads 1] [--rounds 3] [--pair-sentences 10] [--lens-steps 20]
        [--no-suite | --no-pairs] [--tables DIR]
Writes a table to stdout and benchmarks/results/flow.json (or `--out FILE`; the checked-in results are
flow.json from `--no-suite` and flow_suite.json from `--no-pairs --out benchmarks/results/flow_suite.json`,
two runs of a few minutes each rather than one long one on the shared box). MODEL is read only: the
suite's tuned lens goes to a temporary folder.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from meta import begin, write_result
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow
from sklearn.cluster import MiniBatchKMeans

import plmodels
from plmodels.families import family_of
from probes.attribution import (FLOW_SCALE, EmbedTarget, deletion_curve, faithfulness, flow_capacities,
                                integrated_gradients, leave_one_out)
from probes.flow import KMeansMI, discrete_mi
from probes.lens import TunedLens, lm_readout
from workbench.analyses.flow import (ATTRIBUTION_TARGET, FlowRunConfig, _attributions, _batches, _collect, lm_prediction,
                                     _sentences, flow_model)

OUT = Path(__file__).resolve().parent / "results" / "flow.json"
BUDGET_S = 180.0  # issue 78: the suite of one mini checkpoint on 200 sentences


# ------------------------------------------------------------------ the per-sentence path of c9eee1b
def old_flow(attn: np.ndarray, target: int) -> np.ndarray:
    cap = flow_capacities(attn)
    L, T = attn.shape[0], attn.shape[1]
    graph = csr_matrix(np.rint(cap * FLOW_SCALE).astype(np.int32))
    return np.array([maximum_flow(graph, j, L * T + target).flow_value / FLOW_SCALE for j in range(T)])


@torch.no_grad()
def old_value_zeroing(model, run, ids: torch.Tensor) -> np.ndarray:
    T, rows = ids.shape[0], torch.arange(ids.shape[0])

    def zero_own(v, name):
        v = v.clone()
        v[rows, rows] = 0.0
        return v

    L = len(run(ids[None])) - 1
    out = np.zeros((L, T, T))
    for l in range(L):
        with model.hooks([(f"blocks.{l}.attn.v", zero_own)]):
            h = run(ids[None].expand(T + 1, -1))[l + 1].double()
        m = (1.0 - F.cosine_similarity(h[:T], h[T:].expand(T, -1, -1), dim=-1)).T.clamp_min(0).numpy()
        out[l] = m / np.where(m.sum(-1, keepdims=True) > 0, m.sum(-1, keepdims=True), 1.0)
    return out


def old_attribution(model, readout, tok, ids: torch.Tensor, cfg: FlowRunConfig, seed: int) -> dict:
    from probes.attribution import input_x_gradient, rollout
    rng = np.random.default_rng(seed)
    inp, p, token, pos = ATTRIBUTION_TARGET[family_of(model).lm_inputs](tok, ids, rng)

    def score(batch):  # the old forward: (B, T, V) logits computed and dropped
        h = model(batch, output_hidden_states=True).hidden_states[-1][:, p]
        return torch.log_softmax(readout(h).double(), -1)[:, token]

    f = EmbedTarget(model, score, inp, tok.pad_id if tok.pad_id is not None else 0)
    with torch.no_grad():
        out = model(inp[None], output_attentions=True, output_hidden_states=True)
        attn = torch.stack([a[0].nanmean(0) for a in out.attentions]).double().numpy()
        mix = old_value_zeroing(model, lambda b: model(b, output_hidden_states=True).hidden_states, inp)
    ig, _ = integrated_gradients(f, f.x, f.baseline, n_steps=cfg.ig_steps)
    scores = {"rollout": rollout(attn)[p], "flow": old_flow(attn, p), "value_zeroing": rollout(mix, 0.0)[p],
              "input_x_gradient": input_x_gradient(f, f.x), "integrated_gradients": ig}
    scores = {k: v[pos] for k, v in scores.items()} | {f"random{i}": rng.random(len(pos)) for i in range(cfg.random_draws)}
    k = min(cfg.deletion_k, len(pos))
    return {"scores": scores, "loo": leave_one_out(f, f.x, f.baseline, pos),
            "curves": {m: deletion_curve(f, f.x, f.baseline, pos, sc, k) for m, sc in scores.items()}}


def new_attribution(model, readout, tok, ids: torch.Tensor, cfg: FlowRunConfig, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    a = _attributions(model, tok, lm_prediction(model, readout, tok)(ids, rng), cfg)
    f, pos = a["target"], a["pos"]
    scores = a["scores"] | {f"random{i}": rng.random(len(pos)) for i in range(cfg.random_draws)}
    loo, curves, _ = faithfulness(f, f.x, f.baseline, pos, scores, min(cfg.deletion_k, len(pos)))
    return {"scores": scores, "loo": loo, "curves": curves}


def old_kmeans(X: np.ndarray, y: np.ndarray, seed: int, k: int) -> tuple[float, float]:
    lab = MiniBatchKMeans(n_clusters=k, random_state=seed, n_init=1, batch_size=2048).fit_predict(X)
    lab2 = MiniBatchKMeans(n_clusters=k, random_state=seed, n_init=1, batch_size=2048).fit_predict(X)
    return discrete_mi(lab, y), discrete_mi(lab2, np.random.default_rng(seed).permutation(y))


def new_kmeans(X: np.ndarray, y: np.ndarray, seed: int, k: int) -> tuple[float, float]:
    est = KMeansMI(n_clusters=k, n_boot=1, seed=seed).fit(X, y)
    return est.mi_, est.fit_shuffled(X, y, seed=seed).mi_


def old_tuned(readout, hidden: torch.Tensor, cfg: FlowRunConfig) -> torch.Tensor:
    L, N, D = hidden.shape[0] - 1, hidden.shape[1], hidden.shape[2]
    with torch.no_grad():
        target = F.log_softmax(readout(hidden[-1]).float(), -1)
    gen = torch.Generator().manual_seed(cfg.seed)
    weights = []
    for l in range(L):
        W, b = torch.zeros(D, D, requires_grad=True), torch.zeros(D, requires_grad=True)
        opt = torch.optim.Adam([W, b], lr=cfg.tuned_lr)
        for _ in range(cfg.tuned_steps):
            idx = torch.randint(0, N, (min(cfg.tuned_batch, N),), generator=gen)
            h = hidden[l, idx]
            loss = F.kl_div(F.log_softmax(readout(h + h @ W.T + b).float(), -1), target[idx], log_target=True,
                            reduction="batchmean")
            opt.zero_grad()
            loss.backward()
            opt.step()
        weights.append(W.detach())
    return torch.stack(weights)


def new_tuned(readout, hidden: torch.Tensor, cfg: FlowRunConfig) -> torch.Tensor:
    return TunedLens(readout, n_steps=cfg.tuned_steps, lr=cfg.tuned_lr, batch_size=cfg.tuned_batch,
                     seed=cfg.seed).fit(hidden).weight_


def _diff(a, b) -> float:
    if isinstance(a, dict):
        return max(_diff(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return max(_diff(x, y) for x, y in zip(a, b))
    return float(np.max(np.abs(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))))


def paired(name: str, old, new, rounds: int) -> dict:
    """Interleaved rounds of two zero-argument callables -> seconds and the largest difference."""
    diff = _diff(old(), new())  # also the warm-up
    times: dict[str, list[float]] = {"old": [], "new": []}
    for i in range(rounds):
        for which, fn in (("old", old), ("new", new)):
            t0 = time.perf_counter()
            fn()
            times[which].append(time.perf_counter() - t0)
        print(f"{name} round {i + 1}/{rounds}: old {times['old'][-1]:.2f} s, new {times['new'][-1]:.2f} s", flush=True)
    old_s, new_s = statistics.median(times["old"]), statistics.median(times["new"])
    print(f"{name}: old {old_s:.2f} s, new {new_s:.2f} s ({old_s / new_s:.1f}x); max |diff| {diff:.2e}", flush=True)
    return {"times": times, "old_s": old_s, "new_s": new_s, "old_over_new": old_s / new_s, "max_abs_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pair-sentences", type=int, default=10)
    ap.add_argument("--lens-steps", type=int, default=20, help="tuned-lens steps per layer in the paired timing")
    ap.add_argument("--no-suite", action="store_true", help="the paired stages only")
    ap.add_argument("--no-pairs", action="store_true", help="the whole suite only")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--tables", type=Path, default=None,
                    help="keep the suite's tables, flow_run.json and tuned lens in this folder (default: a temporary one)")
    a = ap.parse_args()
    meta = begin()
    torch.set_num_threads(a.threads)
    cfg = FlowRunConfig()
    model, tok = plmodels.load(a.model)
    model.eval().requires_grad_(False)
    readout = lm_readout(model)
    sents = [torch.tensor(s) for s in _sentences(cfg, tok, "test", a.pair_sentences)]
    result: dict = {"model": str(a.model), "kind": family_of(model).kind, "config": cfg.to_dict(),
                    "pair_sentences": len(sents), "rounds": a.rounds, "budget_s": BUDGET_S}
    if not a.no_pairs:
        result["attribution"] = paired(
            f"attribution of {len(sents)} sentences",
            lambda: [old_attribution(model, readout, tok, s, cfg, i) for i, s in enumerate(sents)],
            lambda: [new_attribution(model, readout, tok, s, cfg, i) for i, s in enumerate(sents)], a.rounds)
        reps = _collect(model, _batches(model, tok, _sentences(cfg, tok, "test", cfg.n_sentences), cfg),
                        torch.tensor(sorted(tok.special_ids)))
        r = reps["input"]
        values, counts = np.unique(r["label"], return_counts=True)
        keep = np.isin(r["label"], values[np.argsort(-counts, kind="stable")[: cfg.n_tokens]])
        X, y = r["H"][2][torch.as_tensor(keep)].numpy(), r["label"][keep]
        result["kmeans_layer"] = paired(f"k-means MI + control, one layer ({len(y)} items)",
                                        lambda: old_kmeans(X, y, cfg.seed, cfg.n_clusters),
                                        lambda: new_kmeans(X, y, cfg.seed, cfg.n_clusters), a.rounds)
        hidden = reps["predict"]["H"]
        short = FlowRunConfig(tuned_steps=a.lens_steps)  # the cost is per step: a few steps time it
        result["tuned_lens"] = paired(f"tuned lens, {hidden.shape[0] - 1} layers x {short.tuned_steps} steps",
                                      lambda: old_tuned(readout, hidden, short), lambda: new_tuned(readout, hidden, short),
                                      a.rounds)
    if not a.no_suite:
        with tempfile.TemporaryDirectory() as tmp:
            keep = Path(tmp) if a.tables is None else a.tables
            t0, c0 = time.perf_counter(), time.process_time()
            flow_model(a.model, out_dir=keep / "run", config=cfg, lens_dir=keep / "lens")
            total, cpu = time.perf_counter() - t0, time.process_time() - c0
            run = json.loads((keep / "run" / "flow_run.json").read_text())
            stages, stages_cpu = run["seconds"], run["cpu_seconds"]
        # wall seconds on a shared box include the other processes' share of the cores; the CPU
        # seconds of this process (one torch thread) are what an idle core would take
        result["suite"] = {"seconds": total, "cpu_seconds": cpu, "stages": stages, "stages_cpu": stages_cpu,
                           "within_budget": total <= BUDGET_S,
                           "cpu_within_budget": cpu <= BUDGET_S}
        print(f"suite ({cfg.n_sentences} sentences, attribution of {cfg.attr_sentences}): {total:.1f} s wall, "
              f"{cpu:.1f} s CPU (budget {BUDGET_S:.0f} s); stages wall {stages}, CPU {stages_cpu}", flush=True)
    write_result(a.out, result, meta)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
