"""The faces of the floors (issue 74 part 5, issue 77 part 4): minimal-pair accuracies beside their four
floors, accuracy by number of attractors, the structural probes' best layer beside theirs, and the
competence line that opens every report section, each checked on small tables whose answers are
worked out by hand."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench import figures as F
from workbench.core import results
from workbench.presentation import report, views

COLS = ["model", "suite", "phenomenon", "condition", "variant", "scorer", "metric", "value", "ci_low", "ci_high",
        "n_items", "seed"]


def _pairs() -> pd.DataFrame:
    """dec/clm on two phenomena. npi: 0.9 [0.8, 0.97] clears every floor. agr: 0.7 [0.55, 0.8] clears the
    frequency (0.3) and random_init (0.5) floors but neither chance (the coin's upper end 0.65 >= 0.55) nor
    the bigram (0.6 >= 0.55)."""
    rows = []
    for ph, (v, lo, hi), bigram in (("npi", (0.9, 0.8, 0.97), 0.4), ("agr", (0.7, 0.55, 0.8), 0.6)):
        for scorer, val in (("clm", (v, lo, hi)), ("floor:chance", (0.5, 0.35, 0.65)),
                            ("floor:frequency", (0.3, 0.2, 0.4)), ("floor:bigram", (bigram, 0.3, 0.7)),
                            ("floor:random_init:clm", (0.5, 0.4, 0.6))):
            rows.append(("dec", "templates", ph, "all", "template", scorer, "accuracy", *val, 40, 0))
    # agreement conditions for the attractor curve: two match cells (0 attractors), two mismatch (1)
    for cond, v in (("sing_match", 1.0), ("plur_match", 0.5), ("sing_mismatch", 0.5), ("plur_mismatch", 0.0)):
        rows.append(("dec", "templates", "agr", cond, "template", "clm", "accuracy", v, v - 0.1, v + 0.1, 10, 0))
    rows.append(("dec", "ud", "sva", "attractors:2+", "original", "clm", "accuracy", 0.6, 0.4, 0.8, 20, 0))
    rows.append(("dec", "ud", "sva", "attractors:0", "original", "clm", "accuracy", 0.8, 0.7, 0.9, 30, 0))
    return pd.DataFrame(rows, columns=COLS)


def test_each_pair_accuracy_names_the_floors_its_interval_clears():
    s = views.pairs_summary_frame(_pairs()).set_index("phenomenon")
    assert s.loc["npi", "above"] == "chance, frequency, bigram, random_init" and s.loc["npi", "above_all"]
    assert s.loc["agr", "above"] == "frequency, random_init" and not s.loc["agr", "above_all"]
    assert s.loc["agr", "chance"] == 0.65            # chance shows the coin's upper end, the others their value
    assert s.loc["agr", "bigram"] == 0.6 and s.loc["agr", "random_init"] == 0.5


def test_attractor_counts_pool_the_templates_heads_and_keep_uds_intervals():
    a = views.pairs_attractors_frame(_pairs())
    a = a[a["source"] == "model"].set_index(["phenomenon", "attractors"])
    assert a.loc[("agr", 0), "value"] == pytest.approx(0.75) and a.loc[("agr", 0), "n_items"] == 20
    assert a.loc[("agr", 1), "value"] == pytest.approx(0.25)
    lo, hi = views.wilson_interval(np.array([0.75]), np.array([20.0]))      # pooled: Wilson over the 20 items
    assert a.loc[("agr", 0), "ci_low"] == pytest.approx(lo[0]) and a.loc[("agr", 0), "ci_high"] == pytest.approx(hi[0])
    assert (a.loc[("sva", 2), ["value", "ci_low", "ci_high"]].tolist() == [0.6, 0.4, 0.8])   # one cell: as stored
    assert views.attractors_of("ud", "adjacent") is None and views.attractors_of("templates", "sing") is None


def _probing() -> pd.DataFrame:
    """uuas of m: best single layer 2 (0.6 [0.55, 0.65]); floors chain 0.45 [0.43, 0.47], random_init best at
    layer 1 0.58 [0.5, 0.62] (overlaps), random_tree 0.2."""
    rows = [("m", "structural_distance", "distance", "first", l, "single", "uuas", v, 0, v - 0.05, v + 0.05)
            for l, v in ((0, 0.4), (1, 0.5), (2, 0.6))]
    rows += [("m", "structural_distance", "distance", "first", -1, "chain", "uuas", 0.45, 0, 0.43, 0.47),
             ("m", "structural_distance", "distance", "first", -1, "random_tree", "uuas", 0.2, 0, 0.15, 0.25),
             ("m", "structural_distance", "distance", "first", 0, "random_init", "uuas", 0.3, 0, 0.25, 0.35),
             ("m", "structural_distance", "distance", "first", 1, "random_init", "uuas", 0.58, 0, 0.5, 0.62),
             ("m", "pos", "edge", "first", 1, "single", "accuracy", 0.9, 0, 0.85, 0.95)]
    return pd.DataFrame(rows, columns=["model", "task", "probe", "pooling", "layer", "mode", "metric", "value",
                                       "seed", "ci_low", "ci_high"])


def test_the_structural_best_layer_stands_beside_each_floor():
    f = views.structural_floors_frame(_probing()).set_index("source")
    assert f.loc["model", "layer"] == 2 and f.loc["model", "value"] == pytest.approx(0.6)
    assert f.loc["random_init", "layer"] == 1 and f.loc["random_init", "value"] == 0.58   # its own best layer
    assert f.loc["chain", "above"] == 1.0 and f.loc["random_tree", "above"] == 1.0
    assert f.loc["random_init", "above"] == 0.0          # 0.55 is not above 0.62
    fig = F.structural_floors_figure(views.structural_floors_frame(_probing()), "uuas")
    assert [t.name for t in fig.data] == ["model", "floor: random_tree", "floor: chain", "floor: random_init"]


def test_the_competence_line_says_which_model_it_is_below():
    t = pd.DataFrame({"model": ["a", "b", "c"], "lm_loss": [4.0, 5.5, 7.0], "lm_acc": [0.3, 0.2, 0.1],
                      "unigram_loss": [6.5, 6.5, 6.5], "bigram_loss": [5.0, 5.0, np.nan], "n_targets": [9, 9, 9]})
    text = views.competence_text(t, ["a", "b", "c", "imported"])
    assert "a 4.00 (unigram 6.50, bigram 5.00: below the bigram)" in text
    assert "b 5.50 (unigram 6.50, bigram 5.00: below the unigram but not the bigram)" in text
    assert "c 7.00 (unigram 6.50: not below the unigram)" in text
    assert "no held-out LM loss for imported" in text
    assert views.competence_text(None) == ""
    t = pd.concat([t, pd.DataFrame({"model": ["d"], "lm_loss": [np.nan], "lm_acc": [np.nan], "unigram_loss": [6.5],
                                    "bigram_loss": [5.0], "n_targets": [9]})])
    assert "d no LM loss: its LM head is untrained" in views.competence_text(t)


def test_the_report_opens_every_section_with_the_competence_line_and_shows_the_floors(tmp_path):
    run = tmp_path / "run"
    results.write_table(run, "minimal_pairs", _pairs())
    results.write_table(run, "probing", _probing())
    results.write_table(run, "competence", pd.DataFrame(
        [("dec", "eval", "lm_loss", 4.0, 9), ("dec", "eval", "unigram_loss", 6.5, 9),
         ("dec", "eval", "bigram_loss", 5.0, 9)], columns=["model", "split", "metric", "value", "n_targets"]))
    _, md_path = report.write_report(run)
    md = md_path.read_text()
    line = "*How far each model got, held-out LM loss in nats per target beside a unigram and a bigram model"
    for title in ("Models and training", "Per-layer probing", "Structural probes", "Minimal pairs (behaviour)",
                  "Attention heads"):
        assert md.split(f"## {title}\n\n", 1)[1].startswith(line), title
    assert md.split("## Run\n\n", 1)[1].startswith("- ")
    pairs = md.split("## Minimal pairs (behaviour)\n\n", 1)[1]
    assert "Dec (clm) is above all four floors on 1 of 2 phenomena (templates npi 0.900 [0.800, 0.970])" in pairs
    assert "does not clear the bigram floor on 1 of 2" in pairs
    structural = md.split("## Structural probes\n\n", 1)[1]
    assert ("m's uuas 0.600 [0.550, 0.650] at layer 2 is above random_tree, chain only (highest floor random_init "
            "0.580 [0.500, 0.620], margin 0.020)") in structural.replace("M's", "m's")


def test_the_pairs_figure_draws_every_floor_with_its_interval():
    fig = F.pairs_figure(views.pairs_accuracy_frame(_pairs()), "dec")
    names = [t.name for t in fig.data]
    assert names == ["clm", "floor: chance", "floor: frequency", "floor: bigram", "floor: random_init (clm)"]
    ri = fig.data[-1]
    assert list(ri.y) == [0.5, 0.5] and list(ri.error_y.array) == pytest.approx([0.1, 0.1])
    attr = F.attractors_figure(views.pairs_attractors_frame(_pairs()), "dec")
    assert {t.name for t in attr.data} == {"agr (template, clm)", "sva (original, clm)"}


def test_the_pairs_figure_draws_a_subset_scorers_own_floors_not_the_pooled_ones():
    # masked_word scores a subset of the items and has its own chance/frequency/bigram rows on them
    own = [("dec", "templates", ph, "all", "template", scorer, "accuracy", 0.6, 0.5, 0.7, 20, 0)
           for ph in ("npi", "agr") for scorer in ("floor:chance:masked_word", "floor:frequency:masked_word",
                                                   "floor:bigram:masked_word", "floor:random_init:masked_word")]
    subset = pd.concat([_pairs().query("scorer != 'clm' and scorer != 'floor:random_init:clm'"),
                        pd.DataFrame([(*r[:5], "masked_word", *r[6:]) for r in own[:2]], columns=COLS),
                        pd.DataFrame(own, columns=COLS)])
    names = [t.name for t in F.pairs_figure(views.pairs_accuracy_frame(subset), "dec").data]
    assert names == ["masked_word", "floor: chance (masked_word)", "floor: frequency (masked_word)",
                     "floor: bigram (masked_word)", "floor: random_init (masked_word)"]
    # beside a scorer that scores every item (clm: no rows of its own) the pooled floors stay drawn
    both = pd.concat([_pairs(), subset])
    assert "floor: bigram" in [t.name for t in F.pairs_figure(views.pairs_accuracy_frame(both), "dec").data]


def test_the_probing_summary_puts_the_untrained_models_best_layer_beside_the_score():
    p = _probing()
    extra = pd.DataFrame([("m", "pos", "edge", "first", l, "random_init", "accuracy", v, 0, v - 0.1, v + 0.1)
                          for l, v in ((0, 0.5), (1, 0.7))], columns=p.columns)
    row = views.layer_summary_frame(pd.concat([p, extra]), None, "accuracy").set_index("task").loc["pos"]
    assert row["random_init"] == 0.7 and row["random_init_layer"] == 1 and row["best"] == 0.9


def test_the_zoos_pair_accuracies_split_their_task_into_suite_phenomenon_and_variant():
    stats = pd.DataFrame([("pairs_accuracy", "pairs:ud:subject_verb_agreement:nonce", "bert", -1, 0.6, 0.5, 0.7,
                           0.55, 0.65, "multi-bootstrap", 3, 40),
                          ("pairs_floor:bigram", "pairs:ud:subject_verb_agreement:nonce", "bert", -1, 0.55, 0.4, 0.7,
                           0.45, 0.65, "multi-bootstrap", 3, 40),
                          ("best_layer_score", "pos", "bert", 2, 0.9, 0.8, 0.95, 0.85, 0.93, "multi-bootstrap", 3, 99)],
                         columns=["statistic", "task", "system", "layer", "value", "ci_low", "ci_high", "item_ci_low",
                                  "item_ci_high", "interval", "n_seeds", "n_items"])
    (r,) = views.zoo_pairs_frame(stats).itertuples()
    assert (r.suite, r.phenomenon, r.variant, r.system, r.value, r.n_items) == (
        "ud", "subject_verb_agreement", "nonce", "bert", 0.6, 40)
    assert r.bigram == 0.55                                  # its floor on the same items, beside it
    assert report._statistic_name("pairs_accuracy") == "minimal-pair accuracy"


def _emergence_with_pairs() -> pd.DataFrame:
    rows = []
    for model, shift in (("enc", 0.0), ("dec", 0.3)):
        for step, tokens in ((1, 100), (4, 400), (16, 1600)):
            rows.append((model, step, tokens, "pos", "accuracy_best", 0.5 + 0.02 * step + shift))
            rows.append((model, step, tokens, "lm", "loss", 7.0 - step * 0.1))
            for metric, v in (("accuracy", 0.4 + 0.01 * step), ("accuracy_low", 0.3), ("accuracy_high", 0.7),
                              ("n_items", 40), ("floor:bigram", 0.55), ("floor:chance", 0.5)):
                rows.append((model, step, tokens, "pairs:ud:subject_verb_agreement:original", metric, v))
    return pd.DataFrame(rows, columns=["model", "step", "tokens", "task_or_score", "metric", "value"])


def test_the_probe_behaviour_figure_puts_one_models_probes_beside_its_pair_accuracy(tmp_path):
    em = _emergence_with_pairs()
    fig = F.probe_behaviour_figure(em, "enc")
    probe, acc, floor = fig.data
    assert probe.name == "pos (accuracy)" and list(probe.y) == pytest.approx([0.52, 0.58, 0.82])   # enc's, not dec's
    assert list(probe.x) == [100, 400, 1600]
    assert acc.name == "ud:subject_verb_agreement:original" and list(acc.y) == pytest.approx([0.41, 0.44, 0.56])
    assert list(acc.error_y.array) == pytest.approx([0.29, 0.26, 0.14])
    assert list(floor.y) == [0.55] * 3 and floor.line.dash == "dot"
    results.write_table(tmp_path, "emergence", em)
    section = report.emergence_section(tmp_path)
    assert [f.layout.title.text for f in section.figs[1:]] == [
        "dec: probes and behaviour over pretraining", "enc: probes and behaviour over pretraining"]
