"""A tiny T5 and a tiny BART trained a few steps on the toy corpus: the checkpoints the cross-attention,
decoder-probing and seq2seq pruning tests read (a module-scoped fixture; import it by name)."""
import pytest

from plmodels.training import load_config
from plmodels.training.loop import run_training
from tests.plmodels.toy_runs import fixed_wordpiece, toy_config, toy_corpus


@pytest.fixture(scope="module", params=["bart", "t5"])
def checkpoint(request, tmp_path_factory):
    """A tiny T5 / BART trained a few steps on the toy corpus (tests/plmodels/test_seq2seq_training.py's
    pattern, with the recipes' family options)."""
    fam = request.param
    d = tmp_path_factory.mktemp(fam)
    data = toy_corpus(d / "train.txt", 600, 0), toy_corpus(d / "valid.txt", 100, 1)
    tok = fixed_wordpiece(data[0], d / "tok")
    model = {**load_config(f"{fam}-tiny").model, "dropout": 0.0}
    cfg = toy_config(data, kind="seq2seq", objective=fam, objective_args={"n_sentinels": 16} if fam == "t5" else {},
               tokenizer_path=str(tok), model=model, max_steps=4, eval_sequences=8, warmup_steps=1)
    return fam, run_training(cfg, d / "run").path
