"""Benchmark attention-head analysis (workbench/analyses/heads.py) on a `mini`-shape encoder
(4 layers x 256, 4 heads, random init, WordPiece trained on an EWT-train sample).

Times every head score for EWT dev + test (2,001 + 2,077 sentences), extraction of the word-level
attention included (fresh store), plus the relation table (dev pick, test report, bootstrap) and
the JS-distance MDS map. Target: 60 s on the shared 2-core CPU. Writes benchmarks/results/heads.json.
Run: python benchmarks/bench_heads.py [--threads 2] [--max-sentences N]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from meta import begin, write_result

from plmodels.encoder import Encoder, EncoderConfig
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from workbench.analyses.heads import HeadRunConfig, analyse_loaded
from workbench.data.tasks import ud_sentences

RESULTS = Path(__file__).resolve().parent / "results" / "heads.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-sentences", type=int, default=None)
    a = ap.parse_args()
    meta = begin()
    torch.set_num_threads(a.threads)
    train = ud_sentences("ewt", "train")[:4000]
    tok = Tokenizer.train_wordpiece([" ".join(s.words) for s in train], vocab_size=8000)
    torch.manual_seed(0)
    cfg = {**preset("encoder", "mini"), "vocab_size": tok.vocab_size, "dropout": 0.0}
    model = Encoder(EncoderConfig.from_dict(cfg)).eval()
    run = HeadRunConfig(max_sentences=a.max_sentences, freq_source="ewt:train")
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        tables = analyse_loaded(model, tok, Path(tmp) / "out", run, model_name="mini", progress=False)
        total = time.perf_counter() - t
    out = {"model": "mini encoder (4x256, 4 heads, random init)", "threads": a.threads,
           "max_sentences": a.max_sentences, "total_s": round(total, 1), "target_s": 60,
           "within_target": total <= 60, "n_scores": int(tables["heads"]["score"].nunique()),
           "n_relations": int(len(tables["relations"]))}
    print(out)
    write_result(RESULTS, out, meta)


if __name__ == "__main__":
    main()
