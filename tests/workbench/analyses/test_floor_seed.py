"""Every analysis draws its random-init floor under `plmodels.checkpoint.floor_seed`: seed t + s for a
checkpoint pretrained under seed t (its card's "seed") analysed with seed s, s when t is unknown. Each
analysis' own `random_init_model` is replaced by one that records the seed it is asked for and stops the
run there, so the test reads the seed actually drawn without paying for the analysis."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import plmodels
from plmodels import Decoder, DecoderConfig
from plmodels.tokenizer import Tokenizer
from workbench.analyses import flow, heads, interventions, minimal_pairs, probing
from workbench.core.paths import data_root
from workbench.data.tasks import ud_sentences

pytestmark = pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")


class _Drawn(Exception):
    """Raised by the recording `random_init_model` once the floor's seed is known."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.seed = seed


def _stop_at_draw(model, seed: int):
    raise _Drawn(seed)


# analysis module -> how to run it on a checkpoint with analysis seed s (into an output folder)
RUNS: dict[str, tuple[object, Callable[[Path, int, Path], object]]] = {
    "probing": (probing, lambda p, s, out: probing.probe_model(
        p, tasks=["pos"], out_dir=out, progress=False,
        config={"seeds": [s], "modes": ["random_init"], "layers": [1], "max_train_targets": 10, "max_eval_targets": 5})),
    "heads": (heads, lambda p, s, out: heads.analyse_heads(p, out_dir=out, config={"seed": s, "max_sentences": 4},
                                                            progress=False)),
    "minimal_pairs": (minimal_pairs, lambda p, s, out: minimal_pairs.score_pairs_model(
        p, out_dir=out, config={"seed": s, "suites": ["templates"], "n_per_template": 2, "max_pairs_per_condition": 2},
        progress=False)),
    "interventions": (interventions, lambda p, s, out: interventions.interventions_model(
        p, out_dir=out, config={"seed": s, "n_per_template": 2})),
    "flow": (flow, lambda p, s, out: flow.flow_model(p, out_dir=out, config={"seed": s, "n_sentences": 4})),
}


@pytest.fixture(scope="module")
def model_and_tok():
    tok = Tokenizer.train_bpe([" ".join(s.words) for s in ud_sentences("ewt", "train")[:300]], 400)
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                  max_positions=64)).eval()
    return model, tok


# probing extracts its stores before the draw (~2 s), minimal pairs builds its suites on first use (~4 s)
ANALYSES = [pytest.param(name, marks=pytest.mark.slow) if name in ("minimal_pairs", "probing") else name
            for name in sorted(RUNS)]


@pytest.mark.filterwarnings("ignore:probe pos")  # the capped splits' unseen labels
@pytest.mark.parametrize("analysis", ANALYSES)
@pytest.mark.parametrize(("trained_under", "seed", "drawn"), [(2, 1, 3), (0, 1, 1), (None, 1, 1)])
def test_the_floor_is_drawn_under_the_training_seed_plus_the_analysis_seed(analysis, trained_under, seed, drawn,
                                                                           model_and_tok, tmp_path, monkeypatch):
    model, tok = model_and_tok
    card = {} if trained_under is None else {"seed": trained_under}
    path = plmodels.save(model, tok, tmp_path / "ckpt", card=card)
    module, run = RUNS[analysis]
    monkeypatch.setattr(module, "random_init_model", _stop_at_draw)
    with pytest.raises(_Drawn) as got:
        run(path, seed, tmp_path / "out")
    assert got.value.seed == drawn


def test_the_random_baseline_checkpoint_is_the_probing_floor(model_and_tok, tmp_path):
    """`random_baseline_checkpoint(path, s)` saves the network the probing floor of seed s reads: drawn
    under t + s, and its card says so."""
    model, tok = model_and_tok
    path = plmodels.save(model, tok, tmp_path / "ckpt", card={"seed": 2})
    base = probing.random_baseline_checkpoint(path, tmp_path / "rand", seed=1)
    assert plmodels.checkpoint.training_seed(base) == 3
    want = plmodels.checkpoint.random_init_model(model, 3).state_dict()
    got = plmodels.load(base)[0].state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)
