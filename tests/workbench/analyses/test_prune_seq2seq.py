"""Head importance and pruning curves of an encoder-decoder over its three kinds of attention.

The all-heads mask of a Seq2Seq has the encoder's self-attention rows, then the decoder's
self-attention rows, then the cross-attention rows (`Seq2Seq.split_head_mask`); a row that reached
the wrong sub-layer would break the first test. A planted dead head (a cross-attention head whose
output projection is zero: it contributes nothing, so its gate's gradient and its ablation are
exactly 0) must come out with importance 0 under the right (attention, layer) label, and only it."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from plmodels.checkpoint import load
from plmodels.seq2seq import Seq2Seq, Seq2SeqConfig
from probes.importance import forward, ones_mask
from tests.workbench.analyses.seq2seq_runs import checkpoint  # noqa: F401  (the tiny T5 / BART fixture)
from workbench.analyses.prune import prune_model_cli
from workbench.core.paths import data_root

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_all_heads_mask_reaches_each_kind_of_attention():
    torch.manual_seed(0)
    cfg = Seq2SeqConfig.bart(vocab_size=50, d_model=16, n_layers=2, n_decoder_layers=3, n_heads=2, d_ff=24,
                             max_positions=16, dropout=0.0)
    model = Seq2Seq(cfg).eval()
    assert model.all_heads_per_layer == [2] * (2 + 3 + 3)
    assert model.attention_rows()[2] == ("decoder", 0) and model.attention_rows()[5] == ("cross", 0)
    ids = torch.randint(3, 50, (2, 7))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "decoder_input_ids": torch.randint(3, 50, (2, 5))}
    plain = dict(attention_mask=batch["attention_mask"], decoder_input_ids=batch["decoder_input_ids"])
    for row, (kind, layer) in enumerate(model.attention_rows()):
        mask = ones_mask(model)
        mask[row, 1] = 0.0
        direct = {k: torch.ones(n, 2) for k, n in (("head_mask", 2), ("decoder_head_mask", 3), ("cross_attn_head_mask", 3))}
        direct[{"encoder": "head_mask", "decoder": "decoder_head_mask", "cross": "cross_attn_head_mask"}[kind]][layer, 1] = 0
        with torch.no_grad():
            a = forward(model, batch, mask).logits
            b = model(ids, **plain, **direct).logits
            full = forward(model, batch).logits
        torch.testing.assert_close(a, b, atol=0, rtol=0)
        assert (a - full).abs().max() > 1e-6, (kind, layer)  # the head did something


@pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")
def test_a_dead_cross_attention_head_scores_zero_under_its_own_label(checkpoint, tmp_path):  # noqa: F811
    fam, path = checkpoint
    run = tmp_path / "run"
    shutil.copytree(path.parent, run)  # the run folder: config.resolved.json names the objective's arguments
    model, _ = load(run / path.name)
    Dh = model.config.d_model // model.config.n_heads
    with torch.no_grad():
        model.decoder.blocks[1].cross_attn.out.weight[:, Dh:2 * Dh] = 0.0  # cross-attention layer 1, head 1
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(run / path.name / "model.safetensors"))
    cfg = {"eval_data": "ewt", "n_sequences": 12, "batch_size": 6, "fractions": [0.0, 0.5, 1.0], "random_seeds": [0],
           "tolerances": [0.05], "l0_lambdas": []}
    tables = prune_model_cli(run / path.name, ["michel", "ablation", "confidence", "random"], tmp_path / "out",
                             cfg, progress=False)
    imp = tables["importance"]
    L, Ld, H = model.config.n_layers, model.config.n_decoder_layers, model.config.n_heads
    assert set(imp["method"]) == {"michel", "ablation"}  # confidence is left out for seq2seq, with a note
    for method, df in imp.groupby("method"):
        assert len(df) == (L + 2 * Ld) * H
        assert df.groupby("attention").size().to_dict() == {"encoder": L * H, "decoder": Ld * H, "cross": Ld * H}
        dead = (df["attention"] == "cross") & (df["stack_layer"] == 1) & (df["head"] == 1)
        assert df.loc[dead, "value"].abs().max() < 1e-6, method
        assert (df.loc[~dead, "value"].abs() > 1e-6).all(), method
    curve = tables["pruning"]
    michel = curve[curve["method"] == "michel"].set_index("fraction")["value"]
    assert michel[0.0] != michel[1.0] and curve["metric"].eq("denoising_loss").all()
    assert tables["pruned_speed"].empty
    record = json.loads((tmp_path / "out" / "prune_run.json").read_text())
    assert "denoising loss" in record["objective"] and fam in record["objective"]
    assert any("confidence left out" in n for n in record["notes"]) and "skipped" in record["real_pruning"]
