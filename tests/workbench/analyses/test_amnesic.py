"""workbench.analyses.amnesic on a tiny encoder with EWT: the erasers remove the property from the
probed layer (LEACE to the majority baseline, its random control does not), the hook applies the
same map inside the model, and the table has the documented rows."""
import numpy as np
import pytest
import torch

import plmodels
from plmodels.checkpoint import build_model
from plmodels.presets import preset
from plmodels.tokenizer import Tokenizer
from probes.amnesic import LeaceEraser, RandomEraser
from workbench.analyses.amnesic import AmnesicRunConfig, amnesic_model, eraser_hook, hook_site
from workbench.core.paths import data_root
from workbench.data.tasks import ud_sentences

pytestmark = pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")

CFG = dict(tasks=["pos"], layers=[0, 2], erasers=["leace", "inlp"], inlp_iter=3, max_train_targets=1500,
           max_eval_targets=600, lm_sentences=40, batch_size=16)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    texts = [" ".join(s.words) for s in ud_sentences("ewt", "train")[:400]]
    tok = Tokenizer.train_wordpiece(texts, 400)
    torch.manual_seed(0)
    fields = {**preset("encoder", "tiny"), "vocab_size": tok.vocab_size, "dropout": 0.0, "pad_token_id": tok.pad_id}
    path = tmp_path_factory.mktemp("enc") / "tiny"
    plmodels.save(build_model("encoder", fields), tok, path)
    return path


def test_the_hook_applies_the_erasers_map_at_the_layer(encoder):
    model, tok = plmodels.load(encoder)
    ids = torch.tensor([tok.encode("The cat sat on the mat .")])
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
        X = hidden[1][0].numpy()
        e = LeaceEraser().fit(np.vstack([X] * 3), np.array([0, 1] * (3 * len(X) // 2) + [0] * (3 * len(X) % 2)))
        with model.hooks([(hook_site(1), eraser_hook(e))]):
            got = model(ids, output_hidden_states=True).hidden_states
        with model.hooks([(hook_site(1), eraser_hook(RandomEraser(rank=0).fit(X)))]):
            same = model(ids).last_hidden_state
    torch.testing.assert_close(got[1][0], torch.from_numpy(e.transform(X)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[0], hidden[0])  # earlier layers untouched
    torch.testing.assert_close(same, hidden[-1])  # a rank-0 eraser is the identity


def test_amnesic_rows_and_the_removal(encoder, tmp_path):
    t = amnesic_model(encoder, out_dir=tmp_path, config=CFG, progress=False)["amnesic"]
    assert set(t["eraser"]) == {"none", "leace", "leace_random", "inlp", "inlp_random"}
    assert set(t["layer"]) == {-1, 0, 2}
    v = t.set_index(["layer", "eraser", "metric"])["value"]
    for layer in (0, 2):
        before, after = v[(layer, "none", "probe_acc")], v[(layer, "leace", "probe_acc")]
        assert before > 0.35 and after < before - 0.2, (layer, before, after)  # the property is gone
        assert v[(layer, "leace_random", "probe_acc")] > after + 0.1  # as many random directions leave it
        assert v[(layer, "leace", "rank")] == v[(layer, "leace_random", "rank")] >= 1
        assert v[(layer, "leace", "lm_loss_delta")] == pytest.approx(v[(layer, "leace", "lm_loss")] - v[(-1, "none", "lm_loss")])
    assert (tmp_path / "tables" / "amnesic.parquet").exists() and (tmp_path / "amnesic_run.json").exists()


def test_config_is_checked():
    with pytest.raises(ValueError, match="erasers"):
        AmnesicRunConfig(erasers=("pca",))
