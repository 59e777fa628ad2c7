"""Probing a seq2seq model's decoder under teacher forcing (`ProbeRunConfig.stack = "decoder"`,
`plmodels.seq2seq.TeacherForcedDecoder`): token t's vector is the decoder state that has just read
token t (position t + 1 after the start token), padding changes nothing at the real positions, and a
probing run reads every decoder layer into its own store."""
from __future__ import annotations

import json

import pytest
import torch

from plmodels.seq2seq import Seq2Seq, Seq2SeqConfig, TeacherForcedDecoder
from tests.workbench.analyses.seq2seq_runs import checkpoint  # noqa: F401  (the tiny T5 / BART fixture)
from workbench.analyses.probing import probe_model
from workbench.core.paths import data_root

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_token_t_reads_the_decoder_state_after_token_t_and_ignores_padding(family):
    torch.manual_seed(0)
    make = Seq2SeqConfig.t5 if family == "t5" else Seq2SeqConfig.bart
    model = Seq2Seq(make(vocab_size=40, d_model=16, n_layers=2, n_decoder_layers=3, n_heads=2, d_ff=24,
                         max_positions=12, dropout=0.0, decoder_start_token_id=1)).eval()
    view = TeacherForcedDecoder(model)
    assert view.config.n_layers == 3 and view.config.max_positions == 11 and view.kind == "decoder"
    ids = torch.randint(3, 40, (2, 6))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    ids[1, 4:] = 0
    with torch.no_grad():
        out = view(ids, attention_mask=mask, output_hidden_states=True, unpad=True)
        full = model(ids, attention_mask=mask, decoder_input_ids=torch.cat([torch.ones(2, 1, dtype=torch.long), ids], 1),
                     decoder_attention_mask=torch.cat([torch.ones(2, 1, dtype=torch.long), mask], 1),
                     output_hidden_states=True)
        alone = view(ids[1:, :4], output_hidden_states=True)
    assert len(out.hidden_states) == 4
    for l in range(4):
        torch.testing.assert_close(out.hidden_states[l][0], full.decoder_hidden_states[l][0, 1:])
        torch.testing.assert_close(out.hidden_states[l][1, :4], alone.hidden_states[l][0], atol=1e-5, rtol=0)
        assert out.hidden_states[l][1, 4:].abs().max() == 0  # unpad: zero at the padding
    with pytest.raises(ValueError, match="hidden states only"):
        view(ids, output_attentions=True)


@pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")
def test_probing_the_decoder_reads_its_layers_into_its_own_store(checkpoint, tmp_path):  # noqa: F811
    fam, path = checkpoint
    cfg = dict(tasks=["pos"], modes=["single"], seeds=[0], max_train_targets=300, max_eval_targets=150,
               max_epochs=2, n_boot=0, hidden=16, proj_dim=16)
    dec = probe_model(path, out_dir=tmp_path, config={**cfg, "stack": "decoder"}, model_name=f"{fam}:decoder",
                      progress=False)["probing"]
    record = json.loads((tmp_path / "probe_run.json").read_text())
    assert record["stack"] == "decoder" and record["checkpoint_hash"].endswith(";decoder")
    enc = probe_model(path, out_dir=tmp_path, config=cfg, model_name=fam, progress=False)["probing"]
    n_dec = json.loads((path / "config.json").read_text())["config"]["n_decoder_layers"]
    assert set(dec.loc[dec["mode"] == "single", "layer"]) == set(range(n_dec + 1))
    assert len(list((tmp_path / "store").iterdir())) >= 2  # one store per stack
    a = dec[(dec["metric"] == "accuracy") & (dec["mode"] == "single")].set_index("layer")["value"]
    b = enc[(enc["metric"] == "accuracy") & (enc["mode"] == "single")].set_index("layer")["value"]
    assert a.between(0, 1).all() and not a.equals(b)
    with pytest.raises(ValueError, match="stack"):
        probe_model(path, out_dir=tmp_path, config={**cfg, "stack": "both"}, progress=False)
