"""workbench.analyses.amnesic on a tiny encoder with EWT: the erasers remove the property from the
probed layer (LEACE to the majority baseline, its shuffled-label and same-rank controls do not), the
matched control moves the vectors as far as LEACE, INLP stops on the dev part of the train words, the
hook applies the same map inside the model, and the table has the documented rows."""
import numpy as np
import pytest
import torch

import plmodels
from plmodels.checkpoint import build_model
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from probes.amnesic import LeaceEraser, RandomEraser
from probes.amnesic import INLPEraser
from workbench.analyses.amnesic import AmnesicRunConfig, amnesic_model, eraser_hook, fit_eraser, hook_site
from workbench.core.paths import data_root
from workbench.data.tasks import ud_sentences

pytestmark = pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")

CFG = dict(tasks=["pos"], layers=[0, 2], erasers=["leace", "inlp"], inlp_iter=3, max_train_targets=1500,
           max_eval_targets=600, lm_sentences=40, batch_size=16, draws=2)


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
    controls = {f"{e}_{c}" for e in ("leace", "inlp") for c in ("matched", "shuffled", "same_rank")}
    assert set(t["eraser"]) == {"none", "leace", "inlp"} | controls
    assert set(t["layer"]) == {-1, 0, 2}
    assert set(t[t["eraser"].isin(controls)]["seed"]) == {0, 1} and set(t[~t["eraser"].isin(controls)]["seed"]) == {-1}
    v = t.groupby(["layer", "eraser", "metric"])["value"].mean()  # controls: the mean over the draws
    for layer in (0, 2):
        before, after = v[(layer, "none", "probe_acc")], v[(layer, "leace", "probe_acc")]
        assert before > 0.35 and after < before - 0.2, (layer, before, after)  # the property is gone
        assert v[(layer, "leace_same_rank", "probe_acc")] > after + 0.1  # as many random directions leave it
        assert v[(layer, "leace_shuffled", "probe_acc")] > after + 0.1  # and so does LEACE of shuffled labels
        assert v[(layer, "leace", "rank")] == v[(layer, "leace_matched", "rank")] == v[(layer, "leace_same_rank", "rank")] >= 1
        # the matched control moves the held-out vectors about as far as LEACE (it is matched on the train words)
        assert v[(layer, "leace_matched", "displacement_sq")] == pytest.approx(v[(layer, "leace", "displacement_sq")], rel=0.15)
        assert v[(layer, "leace_same_rank", "displacement_sq")] < v[(layer, "leace", "displacement_sq")]
        assert v[(layer, "leace", "lm_loss_delta")] == pytest.approx(v[(layer, "leace", "lm_loss")] - v[(-1, "none", "lm_loss")])
    assert (tmp_path / "tables" / "amnesic.parquet").exists() and (tmp_path / "amnesic_run.json").exists()


def test_inlp_is_fitted_on_the_first_train_words_and_stops_on_the_last():
    # labels independent of the vectors, 300 rows in 200 dimensions: a classifier separates its
    # training rows (accuracy ~1.0, over the floor of 0.6); on the held-out last half it is at chance
    # (~0.5), so INLP removes nothing
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((300, 200)).astype(np.float32), rng.integers(0, 2, 300)
    cfg = AmnesicRunConfig(inlp_iter=4, inlp_dev_fraction=0.5)
    inlp = fit_eraser("inlp", INLPEraser(n_iter=4, min_accuracy=0.6), X, y, cfg)
    assert inlp.rank_ == 0 and inlp.train_accuracies_[0] > 0.95
    assert INLPEraser(n_iter=4, min_accuracy=0.6).fit(X, y, X, y).rank_ == 4  # stopping on the training rows: 4


def test_config_is_checked():
    with pytest.raises(ValueError, match="erasers"):
        AmnesicRunConfig(erasers=("pca",))
    with pytest.raises(ValueError, match="controls"):
        AmnesicRunConfig(controls=("gaussian",))
    with pytest.raises(ValueError, match="inlp_dev_fraction"):
        AmnesicRunConfig(inlp_dev_fraction=1.0)
