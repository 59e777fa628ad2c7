"""research/scripts/pos_probe_c.py: its C=1 line is the target check's probe, and its second line refits with
the C that `heldout_c` picks on the training sentences."""
import numpy as np
import pandas as pd
import pytest
import torch

import plmodels
from plmodels.encoder import Encoder, EncoderConfig
from plmodels.tokenizer import Tokenizer
from research.ablate import AblationEval, heldout_c, pos_by_layer, pos_vectors, probe_layers
from workbench.data.tasks import ud_sentences

from .scripts import load_script


def _tiny_saved_encoder(tmp_path, seed):
    """An untrained 2-layer encoder with a WordPiece vocabulary of EWT words, saved as a run's final/."""
    texts = [" ".join(s.words) for s in ud_sentences("ewt", "train")[:200]]
    tok = Tokenizer.train_wordpiece(texts, 300)
    torch.manual_seed(seed)
    model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                  max_positions=128, dropout=0.0, position="rope", pad_token_id=tok.pad_id)).eval()
    return model, tok, plmodels.save(model, tok, tmp_path / "run" / "final")


def test_script_reports_the_targets_probe_and_the_heldout_c_refit(tmp_path):
    model, tok, final = _tiny_saved_encoder(tmp_path, seed=0)
    out = tmp_path / "c.parquet"
    assert load_script("pos_probe_c").main([str(final), "--train", "40", "--test", "20", "--out", str(out)]) == 0
    df = pd.read_parquet(out)
    assert sorted(df["probe"].unique()) == ["C=1", "heldout C"] and len(df) == 2 * 3
    assert set(df["test"]) == {"dev:20"}
    ev = AblationEval(pos_train_sentences=40, pos_test_sentences=20)
    c1 = df[df["probe"] == "C=1"].set_index("layer")["accuracy"].to_dict()
    assert c1 == pytest.approx(pos_by_layer(model, tok, tmp_path / "other-store", ev))   # the target check's probe
    (tr, y_tr), (te, y_te) = pos_vectors(model, tok, tmp_path / "run" / "store", ev)
    X_tr, X_te = [tr.layer(l) for l in range(3)], [te.layer(l) for l in range(3)]
    picked, _ = heldout_c(X_tr, y_tr, tr.n_kept())
    refit = df[df["probe"] == "heldout C"].set_index("layer")
    assert refit["C"].to_dict() == picked
    assert refit["accuracy"].to_dict() == pytest.approx(probe_layers(X_tr, y_tr, X_te, y_te, C=picked))
    assert np.isin(list(picked.values()), [0.01, 0.03, 0.1, 0.3, 1.0]).all()


def test_script_reads_a_prefix_of_the_test_sentences_from_the_same_fits_with_intervals(tmp_path):
    model, tok, final = _tiny_saved_encoder(tmp_path, seed=1)
    script = load_script("pos_probe_c")
    big, small = tmp_path / "big.parquet", tmp_path / "small.parquet"
    args = [str(final), "--train", "40", "--n-boot", "300"]
    assert script.main(args + ["--test", "60", "--also-first", "20", "--out", str(big)]) == 0
    assert script.main(args + ["--test", "20", "--out", str(small)]) == 0
    acc = pd.read_parquet(big).set_index(["probe", "test", "layer"])["accuracy"]
    # the first 20 of 60 test sentences, scored by the same fits, read as a run on those 20 alone
    alone = pd.read_parquet(small).set_index(["probe", "test", "layer"])["accuracy"]
    assert acc.xs("dev:20", level="test").to_dict() == pytest.approx(alone.xs("dev:20", level="test").to_dict())
    gains = pd.read_parquet(tmp_path / "big-gains.parquet").set_index(["probe", "test"])
    assert len(gains) == 4
    for (probe, test), g in gains.iterrows():
        by_layer = acc.loc[(probe, test)]
        # the in-sample gain is the table's maximum minus layer 0; the held-out one (the best layer
        # chosen on the other half of the sentences) is never larger, and may be negative
        assert g["gain_in_sample"] == pytest.approx(by_layer.max() - by_layer.loc[0])
        assert g["gain"] <= g["gain_in_sample"] + 1e-12
        assert -1 <= g["lo"] <= g["hi"] <= 1
    assert gains.loc[("C=1", "dev:60"), "n_sentences"] == 60 and gains.loc[("C=1", "dev:20"), "n_sentences"] == 20
