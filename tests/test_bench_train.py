"""benchmarks/bench_train.py (issue 81, part 5): its CPU path writes a stamped result file, its GPU
table covers the issue's shapes, and `--device cuda` where torch sees no GPU stops with one line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_train  # noqa: E402


def test_the_gpu_table_is_the_issues_shapes_and_flops_by_hand():
    got = {(k, p): (s.batch, s.seq_len) for (k, p), s in bench_train.CUDA_SHAPES.items()}
    assert got == {("encoder", "mini"): (128, 128), ("encoder", "base"): (64, 128),
                   ("decoder", "mini"): (64, 256), ("decoder", "base"): (16, 512)}
    # 12 x 768, 16 x 512, causal: 6 B T L (4 D^2 + 2 D FF) + 12 B L T^2 D / 2 + 6 N D V
    s = bench_train.CUDA_SHAPES[("decoder", "base")]
    want = 6 * 16 * 512 * 12 * (4 * 768**2 + 2 * 768 * 3072) + 12 * 16 * 12 * 512**2 * 768 / 2 + 6 * 8192 * 768 * 16000
    assert bench_train.step_flops(8192, True, s, "decoder") == pytest.approx(want, rel=1e-12)


def test_a_compiled_rows_batch_carries_the_config_bound_slots():
    eager = bench_train.batch_for("encoder", shape=bench_train.CUDA_SHAPES[("encoder", "mini")])
    fixed = bench_train.batch_for("encoder", shape=bench_train.CUDA_SHAPES[("encoder", "mini")], fixed_slots=True)
    n = int((eager.labels != -100).sum())
    assert eager.slots.targets.numel() == n  # the batch's own count
    # slot_sizes(128, 128, .15): 19.2 + 6 * 4.04 -> 48 a row, 2457.6 + 6 * 45.7 -> 2736 a batch
    assert fixed.slots.index.shape == (128, 48) and fixed.slots.targets.numel() == 2736 > n
    assert torch.equal(fixed.slots.targets[:n], eager.slots.targets)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_device_cuda_without_a_gpu_is_one_line_naming_the_flag(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), "--device", "cuda",
                        "--out", str(tmp_path / "x.json")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith("--device cuda: torch sees no CUDA device here")
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_the_cpu_path_writes_a_stamped_result_with_paired_ratios(tmp_path):
    out = tmp_path / "train.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), "--kinds", "encoder", "--iters", "2",
                    "--no-bf16", "--threads", "1", "--out", str(out)], check=True, capture_output=True, cwd=ROOT)
    d = json.loads(out.read_text())
    assert "bench_train.py" in d["meta"]["command"] and d["meta"]["commit"]
    ref, ours = d["rows"]
    assert ref["model"] == "HF BertForMaskedLM (eager fp32)" and ours["model"] == "ours encoder fp32"
    assert len(ours["times"]) == 2 and ref["speedup_vs_hf"] == 1.0
    paired = sorted(a / b for a, b in zip(ref["times"], ours["times"]))
    assert ours["speedup_vs_hf"] == pytest.approx(sum(paired) / 2)  # the median of the same-round ratios
