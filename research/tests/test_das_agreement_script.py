"""research/scripts/das_agreement.py: the agreement pairs in both directions, and the floors' rows by hand."""
import numpy as np
import pandas as pd
import pytest
import torch

import plmodels
from tests.workbench.analyses.agreement_runs import agreement_decoder
from workbench.analyses.interventions import InterventionsConfig, agreement_items, build_items, form_logprob_score

from .scripts import load_script

N_PER_TEMPLATE = 8


@pytest.fixture(scope="module")
def das_script():
    return load_script("das_agreement")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny random decoder whose BPE knows every template word (so most items keep their alignment)."""
    return str(agreement_decoder(tmp_path_factory.mktemp("dec") / "ckpt"))


def _clean_and_corrupt_d(ckpt: str) -> tuple[np.ndarray, np.ndarray]:
    """d(u) and d(u') per item, as the interventions analysis scores them (no intervention)."""
    model, tok = plmodels.load(ckpt)
    cfg = InterventionsConfig(n_per_template=N_PER_TEMPLATE)
    items = build_items(model, tok, agreement_items(cfg), "swap_number", 0)
    score, rows = form_logprob_score(items), torch.arange(len(items.owner))
    with torch.no_grad():
        return tuple(items.per_item(score(model, {**b, "row": rows})).numpy() for b in (items.clean, items.corrupt))


def test_each_item_is_two_pairs_with_opposite_labels(das_script, ckpt):
    model, tok = plmodels.load(ckpt)
    pairs, y, score, n = das_script.agreement_pairs(model, tok, N_PER_TEMPLATE, seed=0)
    assert pairs.n_pairs == 2 * n and y.tolist() == [0.0] * n + [1.0] * n
    torch.testing.assert_close(pairs.base["input_ids"][: len(pairs.item) // 2],
                               pairs.source["input_ids"][len(pairs.item) // 2:])
    clean, corrupt = _clean_and_corrupt_d(ckpt)
    with torch.no_grad():
        d_base = pairs.decisions(score(model, pairs.base)).numpy()
    # pair n is based on u, pair n + N on u', both with the form agreeing with u counted +
    np.testing.assert_allclose(d_base, np.r_[clean, corrupt], rtol=0, atol=1e-5)


def test_the_table_is_tidy_and_the_no_intervention_floor_is_the_base_answers(das_script, ckpt):
    table = das_script.run(ckpt, N_PER_TEMPLATE, [0], ["subject"], k=1, epochs=1, lr=0.01, seeds=[0], n_boot=20)
    assert list(table.columns) == das_script.COLUMNS
    assert set(table.metric) == {"iia_das", "iia_random_rotation", "iia_whole_site", "iia_none"}
    assert set(table.variant) == {"trained", "random_init"} and table.value.between(0, 1).all()
    clean, corrupt = _clean_and_corrupt_d(ckpt)
    n = len(clean)
    held_out = np.sort(np.random.default_rng(0).permutation(n)[n // 2:])
    by_hand = (((clean[held_out] > 0) == 0).astype(float) + ((corrupt[held_out] > 0) == 1).astype(float)) / 2
    row = table[(table.variant == "trained") & (table.metric == "iia_none")].iloc[0]
    assert row.n_items == len(held_out)
    assert row.value == pytest.approx(by_hand.mean())


def test_a_bad_position_is_one_line_before_any_work(das_script, capsys):
    with pytest.raises(SystemExit):
        das_script.main(["no/such/model", "out.parquet", "--positions", "subject,attractor"])
    assert "--positions: ['attractor']; choose from ['subject', 'reading']" in capsys.readouterr().err


def test_the_table_reads_back(das_script, ckpt, tmp_path):
    out = tmp_path / "das.parquet"
    das_script.main([ckpt, str(out), "--n-per-template", str(N_PER_TEMPLATE), "--layers", "1", "--positions",
                     "reading", "--epochs", "1", "--n-boot", "10"])
    table = pd.read_parquet(out)
    assert set(table.site) == {"blocks.1.resid_post@reading"} and len(table) == 2 * 4
