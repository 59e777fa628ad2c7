"""Benchmark the activation store (workbench/store/, `extract`).

1. Throughput: all layers + word-level attention on EWT dev with a `mini`-shape encoder (4 x 256,
   4 heads, random init, WordPiece trained on an EWT-train sample) vs transformers' BertModel
   (eager, output_hidden_states + output_attentions, forward only) at the same shape, fed the very
   length-sorted token-budget batches our store uses; interleaved reps, medians (`--fixed` adds HF
   on fixed batches of 32 in corpus order, timed once: slow).
2. Read-back: reading one layer from the store vs recomputing it (hidden-state extraction, SDPA).
3. Peak RAM (VmHWM of a fresh subprocess) extracting all layers of EWT train (~205k words) with a
   6-layer 384-wide encoder, hidden states only.

Prints a table and writes benchmarks/results/extract.json.
`--bf16` adds our extraction with precision="bf16" and HF under bf16 autocast (interleaved).

Two controls split the gain: HF with its linear layers on oneDNN too (`onednn_linear`, the engine
our extraction uses: what is left is our design), and our forward alone on the store's batches
(built outside the timing: what is left is the work around the forward). Targets (issue 66): fp32
>= 1.3x HF eager fp32, precision="bf16" >= 3x HF eager fp32, paired medians.

Run: nice python benchmarks/bench_extract.py [--threads 2] [--reps 3] [--skip-ram] [--fixed] [--bf16]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from meta import begin, write_result

from plmodels.components.cpu_linear import onednn_linear
from plmodels.encoder import Encoder, EncoderConfig
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from workbench.data.align import align_sentences
from workbench.data.tasks import ud_sentences
from workbench.store import Store, extract, forward_layers
from workbench.store.batching import build_batch, make_batches

RESULTS = Path(__file__).resolve().parent / "results" / "extract.json"


def _tokenizer(n_train: int = 4000, vocab: int = 8000) -> Tokenizer:
    train = ud_sentences("ewt", "train")[:n_train]
    return Tokenizer.train_wordpiece([" ".join(s.words) for s in train], vocab_size=vocab)


def _encoder(tok: Tokenizer, shape: dict) -> Encoder:
    torch.manual_seed(0)
    return Encoder(EncoderConfig(**{**preset("encoder", "mini"), **shape, "vocab_size": tok.vocab_size,
                                    "dropout": 0.0})).eval()


def _hf_bert(model: Encoder):
    from transformers import BertConfig, BertModel

    c = model.config
    cfg = BertConfig(vocab_size=c.vocab_size, hidden_size=c.d_model, num_hidden_layers=c.n_layers,
                     num_attention_heads=c.n_heads, intermediate_size=c.d_ff, max_position_embeddings=c.max_positions,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return BertModel(cfg, add_pooling_layer=False).eval()


def _hf_run(hf, batches: list[list[list[int]]], bf16: bool = False, onednn: bool = False) -> float:
    t0 = time.perf_counter()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), \
            onednn_linear() if onednn else contextlib.nullcontext():
        for b in batches:
            T = max(map(len, b))
            ids = torch.zeros(len(b), T, dtype=torch.long)
            mask = torch.zeros(len(b), T, dtype=torch.long)
            for i, x in enumerate(b):
                ids[i, : len(x)] = torch.tensor(x)
                mask[i, : len(x)] = 1
            hf(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    return time.perf_counter() - t0


def _forward_only(model, batches, precision: str) -> float:
    """Our extraction's forward (`forward_layers`, attentions on) over prepared batches: no
    alignment, batching, pooling or writes."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            forward_layers(model, b.ids, b.mask, True, precision)
    return time.perf_counter() - t0


def throughput(tok: Tokenizer, workdir: Path, reps: int = 3, fixed: bool = False, bf16: bool = False) -> dict:
    sents = [list(s.words) for s in ud_sentences("ewt", "dev")]
    model = _encoder(tok, {})
    hf = _hf_bert(model)
    ids = [e.ids for e in tok.encode_words_batch(sents)]
    n_tok = sum(map(len, ids))
    # the very batches our store uses (workbench.store.batching.make_batches, 8192-token budget)
    sorted_b = [[ids[i] for i in b] for b in make_batches([SimpleNamespace(ids=x) for x in ids], 8192, None)]
    computed = sum(len(b) * len(b[0]) for b in sorted_b)  # B * T_max summed: real + padding
    _hf_run(hf, sorted_b[-2:])  # warm-up
    _hf_run(hf, sorted_b[-2:], onednn=True)
    # our forward alone: the store's own batches, built here, outside the timing
    align = align_sentences(tok, sents, model.config.max_positions)
    offsets = np.r_[0, np.cumsum(align.n_kept)]
    prepared = [build_batch([align.pieces[i] for i in b], offsets, tok.pad_id or 0)
                for b in make_batches(align.pieces, 8192, None)]
    _forward_only(model, prepared[-2:], "fp32")  # warm-up
    # The CPU is shared: interleave the methods (A, B, C, A, B, C, ...) and compare medians.
    t_sorted, t_ours, t_hid, t_hf16, t_ours16 = [], [], [], [], []
    t_dnn, t_fwd, t_dnn16, t_fwd16 = [], [], [], []
    for r in range(reps):
        t_sorted.append(_hf_run(hf, sorted_b))
        t_dnn.append(_hf_run(hf, sorted_b, onednn=True))
        t_fwd.append(_forward_only(model, prepared, "fp32"))
        t0 = time.perf_counter()
        store = extract(model, tok, sents, workdir / f"a{r}", attentions=True, progress=False)
        t_ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        hid = extract(model, tok, sents, workdir / f"h{r}", attentions=False, progress=False)
        t_hid.append(time.perf_counter() - t0)
        line = (f"rep {r + 1}/{reps}: HF sorted {t_sorted[-1]:.1f}s, ours attn {t_ours[-1]:.1f}s, "
                f"ours hidden {t_hid[-1]:.1f}s, HF oneDNN {t_dnn[-1]:.1f}s, our forward {t_fwd[-1]:.1f}s")
        if bf16:  # the same two, both under bf16 autocast
            t_hf16.append(_hf_run(hf, sorted_b, bf16=True))
            t0 = time.perf_counter()
            extract(model, tok, sents, workdir / f"b{r}", attentions=True, precision="bf16", progress=False)
            t_ours16.append(time.perf_counter() - t0)
            t_dnn16.append(_hf_run(hf, sorted_b, bf16=True, onednn=True))
            t_fwd16.append(_forward_only(model, prepared, "bf16"))
            line += (f", HF bf16 {t_hf16[-1]:.1f}s, ours attn bf16 {t_ours16[-1]:.1f}s, "
                     f"HF bf16 oneDNN {t_dnn16[-1]:.1f}s, our bf16 forward {t_fwd16[-1]:.1f}s")
        print(line, flush=True)
    med = lambda xs: float(np.median(xs))
    res = {"hf_sorted_s": t_sorted, "ours_attn_s_all": t_ours, "ours_hidden_s_all": t_hid,
           "ours_vs_hf_paired": med([a / b for a, b in zip(t_sorted, t_ours)]),  # same-rep ratios
           "hf_onednn_s_all": t_dnn, "ours_forward_s_all": t_fwd,
           "ours_vs_hf_onednn_paired": med([a / b for a, b in zip(t_dnn, t_ours)]),
           "forward_share_fp32": med([a / b for a, b in zip(t_fwd, t_ours)])}
    if bf16:
        res.update(hf_bf16_s_all=t_hf16, ours_attn_bf16_s_all=t_ours16,
                   ours_bf16_vs_hf_fp32_paired=med([a / b for a, b in zip(t_sorted, t_ours16)]),
                   ours_bf16_vs_hf_bf16_paired=med([a / b for a, b in zip(t_hf16, t_ours16)]),
                   hf_bf16_onednn_s_all=t_dnn16, ours_forward_bf16_s_all=t_fwd16,
                   ours_bf16_vs_hf_bf16_onednn_paired=med([a / b for a, b in zip(t_dnn16, t_ours16)]),
                   forward_share_bf16=med([a / b for a, b in zip(t_fwd16, t_ours16)]),
                   # the most a faster preparation and write could give: HF fp32 over our forward alone
                   bf16_bound_forward_only=med([a / b for a, b in zip(t_sorted, t_fwd16)]))
    t_sorted, t_ours, t_hid = med(t_sorted), med(t_ours), med(t_hid)
    if fixed:  # slow (corpus order pads every batch to its longest sentence); measured once
        res["hf_fixed32_tok_s"] = n_tok / _hf_run(hf, [ids[i: i + 32] for i in range(0, len(ids), 32)])
    t0 = time.perf_counter()
    again = extract(model, tok, sents, workdir / "a0", attentions=True, progress=False)
    t_cached = time.perf_counter() - t0
    assert again.path.parent == workdir / "a0"
    # read-back: one layer from disk (fresh Store, copy into RAM) vs recomputing it
    reads = []
    for l in range(hid.n_layers):
        t0 = time.perf_counter()
        x = np.array(Store.open(hid.path).layer(l))
        reads.append(time.perf_counter() - t0)
    t_read = float(np.median(reads))
    return {
        "sentences": len(sents), "tokens": n_tok, "words": store.n_words, "batches": len(sorted_b),
        "computed_over_real_tokens": computed / n_tok,
        "hf_sorted_tok_s": n_tok / t_sorted, "ours_attn_tok_s": n_tok / t_ours,
        "ours_vs_hf_sorted": t_sorted / t_ours, "ours_hidden_only_tok_s": n_tok / t_hid,
        "ours_attn_s": t_ours, "ours_cached_request_s": t_cached,
        "read_layer_s": t_read, "recompute_hidden_s": t_hid, "read_speedup": t_hid / t_read,
        "layer_shape": list(x.shape), "store_mib": sum(f.stat().st_size for f in store.path.iterdir()) / 2**20,
        **res,
    }


RAM_CHILD = r"""
import sys, time, torch
torch.set_num_threads(int(sys.argv[2]))
sys.path.insert(0, sys.argv[3])
from bench_extract import _tokenizer, _encoder
from workbench.store import extract
from workbench.data.tasks import ud_sentences
tok = _tokenizer()
model = _encoder(tok, {"n_layers": 6, "d_model": 384, "n_heads": 6, "d_ff": 1536})
sents = [list(s.words) for s in ud_sentences("ewt", "train")]
t0 = time.perf_counter()
store = extract(model, tok, sents, sys.argv[1], progress=False)
dt = time.perf_counter() - t0
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print({"words": store.n_words, "layers": store.n_layers, "seconds": dt, "vmhwm_kib": int(hwm)})
"""


def peak_ram(workdir: Path, threads: int) -> dict:
    out = subprocess.run([sys.executable, "-c", RAM_CHILD, str(workdir / "ram"), str(threads),
                          str(Path(__file__).resolve().parent)], capture_output=True, text=True, check=True)
    res = eval(out.stdout.strip().splitlines()[-1])  # our own child's dict literal
    return {"ram_words": res["words"], "ram_layers": res["layers"], "ram_seconds": res["seconds"],
            "peak_rss_mib": res["vmhwm_kib"] / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-ram", action="store_true", help="keep the peak-RAM figures of the last run")
    ap.add_argument("--fixed", action="store_true", help="also time HF on fixed batches of 32 (slow)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (median; the CPU may be shared)")
    ap.add_argument("--bf16", action="store_true", help="also time ours (precision='bf16') and HF under bf16 autocast")
    args = ap.parse_args()
    meta = begin()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    tok = _tokenizer()
    with tempfile.TemporaryDirectory() as d:
        res = {"threads": torch.get_num_threads(), "reps": args.reps, "torch": torch.__version__}
        res.update(throughput(tok, Path(d), args.reps, args.fixed, args.bf16))
        if not args.skip_ram:
            res.update(peak_ram(Path(d), args.threads))
        elif RESULTS.is_file():
            old = json.loads(RESULTS.read_text())
            kept = {k: v for k, v in old.items() if k.startswith("ram_") or k == "peak_rss_mib"}
            # the RAM figures keep the meta of the run that measured them (None: it predates meta)
            res.update(kept, ram_from_previous_run=bool(kept), ram_meta=old.get("ram_meta", old.get("meta")))
    res["load_average"] = [load_start, os.getloadavg()]
    write_result(RESULTS, res, meta)
    print(f"{'measure':40s} {'value':>14s}")
    for k, v in res.items():
        if not isinstance(v, list):
            print(f"{k:40s} {v:>14.2f}" if isinstance(v, float) else f"{k:40s} {str(v):>14s}")
    ok = {"attn extraction >= 1.3x HF eager (same sorted batches, paired median)": res["ours_vs_hf_paired"] >= 1.3,
          "read-back >= 10x recompute": res["read_speedup"] >= 10}
    if "ours_bf16_vs_hf_fp32_paired" in res:
        ok["attn extraction, precision bf16 >= 3x HF eager fp32 (paired median)"] = res["ours_bf16_vs_hf_fp32_paired"] >= 3.0
    if "hf_fixed32_tok_s" in res:
        ok["attn extraction >= HF eager (fixed batches)"] = res["ours_attn_tok_s"] >= res["hf_fixed32_tok_s"]
    if "peak_rss_mib" in res:
        ok["peak RSS < 2 GB (EWT train, 6x384)"] = res["peak_rss_mib"] < 2048
    for k, v in ok.items():
        print(f"{'PASS' if v else 'FAIL'}  {k}")


if __name__ == "__main__":
    main()
