"""workbench.analyses.probing glue: tables in the design.md schemas, a layer score equal to a direct EdgeProbe
fit on the store, clear errors (bad layer, unseen labels, unknown config keys), random baseline."""
import json

import numpy as np
import pandas as pd
import plotly.io
import pytest
import torch

import plmodels
from plmodels.checkpoint import random_init_model
from plmodels.encoder import Encoder, EncoderConfig
from plmodels.tokenizer import Tokenizer
from probes.arcs import ArcProbe
from probes.edge import EdgeProbe
from probes.layers import MIX_COLUMNS, PROBING_COLUMNS, SUMMARY_COLUMNS, center_of_gravity
from workbench.analyses.probing import (
    ProbeRunConfig,
    load_split,
    probe_model,
    probe_params,
    random_baseline_checkpoint,
    select_records,
    structural_data,
)
from workbench.core.results import load_table
from workbench.data.tasks import load_task, ud_sentences
from workbench.presentation.analysis_figures import write_analysis_figures
from workbench.store import Store, task_arrays

CFG = dict(tasks=["pos", "deps"], modes=["single", "mix", "cumulative", "control"], seeds=[0, 1],
           max_train_targets=200, max_eval_targets=100, max_epochs=2, n_boot=50, hidden=16, proj_dim=16)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    sents = ud_sentences("ewt", "train")[:300]
    tok = Tokenizer.train_wordpiece([" ".join(s.words) for s in sents], vocab_size=1500)
    model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                  max_positions=96, dropout=0.0))
    return plmodels.save(model, tok, tmp_path_factory.mktemp("m") / "tiny")


@pytest.fixture(scope="module")
def run(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("probe")
    tables = probe_model(ckpt, tasks=["pos", "deps"], out_dir=out, config=CFG, progress=False)
    return out, tables


def test_tables_have_the_design_schema_and_one_row_per_key(run):
    _, t = run
    assert list(t["probing"].columns) == PROBING_COLUMNS
    assert list(t["probing_summary"].columns) == SUMMARY_COLUMNS
    assert list(t["mix_weights"].columns) == MIX_COLUMNS
    p = t["probing"]
    assert not p.duplicated(["model", "task", "probe", "layer", "mode", "metric", "seed"]).any()
    assert set(p["model"]) == {"tiny"} and set(p["task"]) == {"pos", "deps"}
    assert set(p["pooling"]) == {"self_attn"}  # encoder: self-attentive span pooling, recorded
    single = p[(p["mode"] == "single") & (p["metric"] == "accuracy") & (p["seed"] >= 0)]
    # 3 layers (embeddings + 2 blocks) x 2 seeds per task
    assert single.groupby("task").size().to_dict() == {"deps": 6, "pos": 6}
    assert set(p[p["mode"] == "mix"]["layer"]) == {-1}
    assert {"selectivity", "delta_micro_f1"} <= set(p["metric"])


def test_summary_values_are_in_range(run):
    _, t = run
    s = t["probing_summary"].set_index(["task", "metric"])["value"]
    p = t["probing"]
    for task in ("pos", "deps"):
        assert 0.0 <= s[(task, "expected_layer")] <= 2.0
        # Tenney's center of gravity, from the table's own differential rows; it lies in [0, 2] only
        # when no delta is negative (a cumulative score that falls can push it outside)
        d = p[(p.task == task) & p.metric.str.startswith("delta_")].sort_values("layer")
        assert len(d) == 3 and d.metric.nunique() == 1
        cog, delta = s[(task, "center_of_gravity")], d.value.to_numpy()
        assert cog == pytest.approx(center_of_gravity(delta, d.layer.to_numpy()), abs=1e-12, nan_ok=True)
        if delta.sum() > 0 and (delta >= 0).all():
            assert -1e-12 <= cog <= 2.0 + 1e-12
    w = t["mix_weights"].groupby(["task", "seed"])["weight"].sum()
    np.testing.assert_allclose(w.to_numpy(), 1.0, atol=1e-6)


def test_layer_score_equals_a_direct_edge_probe_on_the_store(run, ckpt):
    out, t = run
    info = json.loads((out / "probe_run.json").read_text())["counts"]["pos"]
    train_recs = select_records(load_task("pos", "train"), 200, 0)
    test_recs = select_records(load_task("pos", "test"), 100, 0)
    tr = task_arrays(Store(info["train_store"]), train_recs)
    te = task_arrays(Store(info["eval_store"]), test_recs)
    n_tr = min(200, len(tr.labels))
    keep = np.isin(te.labels[:100], tr.labels[:n_tr])
    assert int((~keep).sum()) == info["eval_unseen_label_dropped"]
    probe = EdgeProbe(pooling="self_attn", hidden=16, proj_dim=16, max_epochs=2, patience=2, batch_size=1024, seed=0)
    probe.fit(tr.store.layer(1), tr.labels[:n_tr], tr.span1[:n_tr])
    acc = probe.score(te.store.layer(1), te.labels[:100][keep], te.span1[:100][keep])["accuracy"]
    p = t["probing"]
    row = p[(p.task == "pos") & (p.layer == 1) & (p["mode"] == "single") & (p.metric == "accuracy") & (p.seed == 0)]
    assert len(row) == 1
    assert row["value"].iloc[0] == pytest.approx(acc, abs=1e-9)


def test_tables_written_to_the_run_folder_and_figures(run):
    out, t = run
    pd.testing.assert_frame_equal(load_table(out, "probing").reset_index(drop=True), t["probing"],
                                  check_dtype=False)
    written = write_analysis_figures("probe", t, out)   # what `workbench probe` draws from the tables
    assert {p.name for p in written} == {f"probing_{k}_tiny.json" for k in ("layers", "cumulative", "mix", "summary")}
    fig = plotly.io.from_json((out / "figures" / "probing_layers_tiny.json").read_text())
    assert {tr.name for tr in fig.data} == {"tiny"} and len(fig.data) == t["probing"]["task"].nunique()
    rec = json.loads((out / "probe_run.json").read_text())
    assert rec["span_pooling"] == "self_attn" and rec["word_pooling"] == "first"
    assert rec["counts"]["deps"]["train_targets"] == 200


def test_progress_bar_counts_one_fit_per_task_probe_and_mode(run, ckpt, tmp_path, capsys):
    # deps is a span task: its control mode does not apply, and still counts as done
    cfg = {**CFG, "modes": ["single", "control"], "seeds": [0], "n_boot": 0}
    probe_model(ckpt, tasks=["pos", "deps"], out_dir=tmp_path, config=cfg, store_root=run[0] / "store")
    err = capsys.readouterr().err.splitlines()
    bars = [line for line in err if " fit [" in line]
    assert bars[0].startswith("probe tiny:   0% 0/4 fit") and bars[-1].startswith("probe tiny: 100% 4/4 fit ["), err
    assert any(line.startswith("probe tiny: task deps: ") and "train /" in line for line in err)


def test_kept_items_give_back_every_single_cumulative_and_random_init_score(run, ckpt, tmp_path):
    """probe_items (keep_items): the mean of the items' `correct` is the table's accuracy and the
    micro-F1 of their summed counts its micro-F1, for every single, cumulative and random-init fit and
    seed, the random-init floor's on the model's own test items (the zoo resamples both)."""
    cfg = {**CFG, "modes": ["single", "cumulative", "random_init"], "n_boot": 0, "keep_items": True}
    t = probe_model(ckpt, tasks=["pos", "deps"], out_dir=tmp_path, config=cfg, store_root=run[0] / "store",
                    progress=False)
    items, probing = t["probe_items"], t["probing"]
    assert set(items["mode"]) == {"single", "cumulative", "random_init"} and set(items["seed"]) == {0, 1}
    n = items.groupby(["task", "mode", "layer", "seed"]).size().groupby(["task"]).nunique()
    assert (n == 1).all()   # every fit, the floor's included, scores the same test items
    for (task, mode, layer, seed), g in items.groupby(["task", "mode", "layer", "seed"]):
        assert g["item"].tolist() == list(range(len(g)))
        row = probing[(probing.task == task) & (probing["mode"] == mode) & (probing.layer == layer)
                      & (probing.seed == seed)].set_index("metric")["value"]
        assert g["correct"].mean() == pytest.approx(row["accuracy"], abs=1e-6)
        tp, fp, fn = g["tp"].sum(), g["fp"].sum(), g["fn"].sum()
        assert 2 * tp / (2 * tp + fp + fn) == pytest.approx(row["micro_f1"], abs=1e-6)
    assert load_table(tmp_path, "probe_items").shape == items.shape


def test_arcs_task_equals_a_direct_arc_probe_on_the_store(run, ckpt, tmp_path):
    # the arcs task goes to probes.arcs: head rows from the records, sentence bounds from the store,
    # punctuation left out of the score, Hewitt & Liang's arc control and a held-out best layer
    cfg = {**CFG, "modes": ["single", "mix", "control"], "seeds": [0], "n_boot": 0}
    t = probe_model(ckpt, tasks=["arcs"], out_dir=tmp_path, config=cfg, store_root=run[0] / "store", progress=False)
    p = t["probing"]
    assert set(p["mode"]) == {"single", "best", "control"} and set(p["probe"]) == {"bilinear"}   # no mix
    info = json.loads((tmp_path / "probe_run.json").read_text())["counts"]["arcs"]
    recs = {sp: select_records(load_task("arcs", sp), n, 0) for sp, n in (("train", 200), ("test", 100))}
    arr = {sp: task_arrays(Store(info[f"{'train' if sp == 'train' else 'eval'}_store"]), r) for sp, r in recs.items()}
    assert info["eval_unseen_label_dropped"] == 0 and info["train_targets"] == 200

    def bounds(a):
        start = a.store.sent_offsets[a.sent_index]
        return np.stack([start, start + a.store.n_kept()[a.sent_index]], 1)

    tr, te = arr["train"], arr["test"]
    tr = (tr.store.layer(1), tr.span1[:200, 0], tr.span2[:200, 0], bounds(tr)[:200])
    keep = te.labels[:100] != "punct"
    probe = ArcProbe(seed=0).fit(*tr)
    acc = probe.score(te.store.layer(1), te.span1[:100, 0][keep], te.span2[:100, 0][keep], bounds(te)[:100][keep])
    row = p[(p.layer == 1) & (p["mode"] == "single") & (p.metric == "accuracy") & (p.seed == 0)]
    assert row["value"].iloc[0] == pytest.approx(acc, abs=1e-9)
    s = t["probing_summary"]
    assert s.to_dict("records")[0]["metric"] == "selectivity" and len(s) == 1


def test_structural_tasks_read_whole_ewt_trees_from_the_arcs_records(run, ckpt, tmp_path):
    # seed 1: the fixture's model is itself torch seed 0's fresh init, which random_init(seed 0) would redraw
    cfg = {**CFG, "modes": ["single"], "seeds": [1], "n_boot": 0, "structural_train_words": 300}
    t = probe_model(ckpt, tasks=["structural_distance", "structural_depth"], out_dir=tmp_path, config=cfg,
                    store_root=run[0] / "store", progress=False)["probing"]
    per_task = t[(t["seed"] == 1) & (t["mode"] == "single")].groupby("task")["metric"].agg(set).to_dict()
    assert per_task == {"structural_distance": {"uuas", "dspr"}, "structural_depth": {"root_acc", "nspr"}}
    assert t["value"].between(-1, 1).all()
    # the four floors beside the probe, named in `mode`: the layer-free ones at layer -1, the random-init
    # model at every layer, reading other vectors than the model's
    layers = t.groupby("mode")["layer"].agg(set).to_dict()
    assert layers == {"single": {0, 1, 2}, "random_init": {0, 1, 2}, "random_tree": {-1}, "chain": {-1},
                      "position": {-1}}
    assert set(t[t["mode"] == "random_tree"]["metric"]) == {"uuas", "root_acc"}
    key = ["task", "layer", "metric"]
    both = t[t["mode"] == "single"].merge(t[t["mode"] == "random_init"], on=key, suffixes=("", "_rand"))
    assert len(both) == 12 and (both["value"] != both["value_rand"]).any()
    # training size: whole sentences until structural_train_words words (not max_train_targets), in the record
    rec = json.loads((tmp_path / "probe_run.json").read_text())["counts"]["structural_distance"]
    assert 300 <= rec["train_targets"] < 300 + 100 and rec["train_words"] <= rec["train_targets"]
    assert rec["train_sentences"] >= 10 and rec["eval_sentences"] >= 1 and rec["train_sentences_cut"] >= 0
    # the trees handed to the probe are EWT's own: heads of the first kept sentence, root -1
    split = load_split(*plmodels.load(ckpt), "arcs", "test", ProbeRunConfig.from_dict(cfg), run[0] / "store",
                       plmodels.checkpoint_hash(ckpt), 100, None, False)
    data, cut = structural_data(split)
    rec = select_records(load_task("arcs", "test"), 100, 0)
    first = int(np.unique(split.arrays.sent_index)[0])
    gold = {tuple(r["words"]): r for r in rec}[tuple(split.words[data.bounds[0][0]:data.bounds[0][1]])]
    expect = [-1 if t["span2"][0] == t["span1"][0] else t["span2"][0] for t in gold["targets"]]
    assert data.heads[0].tolist() == expect and first >= 0 and cut >= 0
    assert data.punct_mask[0].tolist() == [t["label"] == "punct" for t in gold["targets"]]


def test_records_are_read_once_per_split_for_every_task_and_floor_that_reads_them(run, ckpt, tmp_path, monkeypatch):
    """arcs, both structural tasks and their random-init floor read EWT's arcs records: each split is read
    from disk once per run, and a task's records are let go when no task ahead reads them."""
    import workbench.analyses.probing as probing
    reads = []
    real = probing.load_task
    monkeypatch.setattr(probing, "load_task", lambda task, split, **kw: reads.append((task, split)) or real(task, split, **kw))
    cfg = {**CFG, "modes": ["single"], "seeds": [1], "n_boot": 0, "structural_train_words": 100, "layers": [1],
           "structural_baselines": ["chain", "random_init"]}
    probe_model(ckpt, tasks=["structural_distance", "pos", "structural_depth", "pos"], out_dir=tmp_path, config=cfg,
                store_root=run[0] / "store", progress=False)
    assert reads == [("arcs", "train"), ("arcs", "test"), ("pos", "train"), ("pos", "test")]


def test_unseen_eval_labels_error_names_the_task(ckpt, tmp_path):
    cfg = {**CFG, "max_train_targets": 10, "modes": ["single"], "seeds": [0], "layers": [0],
           "unseen_labels": "error"}
    with pytest.raises(ValueError, match=r"probe deps .*labels not seen in training"):
        probe_model(ckpt, tasks=["deps"], out_dir=tmp_path, config=cfg, progress=False)


def test_layer_the_model_lacks_is_a_clear_error(ckpt, tmp_path):
    with pytest.raises(ValueError, match=r"layers \[5\].*0\.\.2"):
        probe_model(ckpt, tasks=["pos"], out_dir=tmp_path, config={**CFG, "layers": [0, 5]}, progress=False)


def test_config_unknown_keys_and_bad_values(tmp_path):
    with pytest.raises(ValueError, match="unknown key 'sedes'"):
        ProbeRunConfig.from_dict({"sedes": [0]})
    with pytest.raises(ValueError, match="modes"):
        ProbeRunConfig(modes=("single", "wrong"))
    p = tmp_path / "c.json"
    p.write_text('{"seeds": [0],\n "tasks": }')
    with pytest.raises(ValueError, match="c.json: invalid JSON at line 2"):
        ProbeRunConfig.load(p)
    p.write_text('{"seeds": [0], "max_epochs": "10"}')   # a wrong type names the file, the field, the value
    with pytest.raises(ValueError, match=r'c.json: max_epochs: input should be a valid integer, got "10"'):
        ProbeRunConfig.load(p)
    assert ProbeRunConfig.resolve(None, {"seeds": [4]}) == ProbeRunConfig(seeds=(4,))


def test_random_baseline_keeps_architecture_and_tokenizer(ckpt, tmp_path):
    out = random_baseline_checkpoint(ckpt, tmp_path / "rand", seed=3)
    (m0, t0), (m1, t1) = plmodels.load(ckpt), plmodels.load(out)
    assert m0.config == m1.config and t0.fingerprint() == t1.fingerprint()
    s0, s1 = m0.state_dict(), m1.state_dict()
    assert s0.keys() == s1.keys()
    assert all(s0[k].shape == s1[k].shape for k in s0)
    assert not any(torch.equal(s0[k], s1[k]) for k in s0 if k.endswith("weight") and s0[k].dim() == 2)
    again = random_baseline_checkpoint(ckpt, tmp_path / "rand2", seed=3)
    s2 = plmodels.load(again)[0].state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)  # same seed, same weights


@pytest.mark.parametrize("name", ["edge", "linear"])
def test_standardize_reaches_both_probes(name):
    """ProbeRunConfig.standardize (off by default, as Tenney et al.'s probe) is passed to the probe."""
    assert probe_params(name, ProbeRunConfig(), "mean")["standardize"] is False
    assert probe_params(name, ProbeRunConfig(standardize=True), "mean")["standardize"] is True


def test_structural_baselines_are_checked_and_can_be_left_out(ckpt, run, tmp_path):
    with pytest.raises(ValueError, match=r"structural_baselines: unknown \['tree'\]"):
        ProbeRunConfig(structural_baselines=("tree",))
    with pytest.raises(ValueError, match="structural_train_words must be an int >= 2"):
        ProbeRunConfig(structural_train_words=1)
    cfg = {**CFG, "modes": ["single"], "seeds": [0], "n_boot": 0, "structural_train_words": 200,
           "structural_baselines": ["chain"], "layers": [1]}
    t = probe_model(ckpt, tasks=["structural_depth"], out_dir=tmp_path, config=cfg, store_root=run[0] / "store",
                    progress=False)["probing"]
    assert sorted(set(t["mode"])) == ["chain", "single"]


def test_random_init_mode_equals_probing_the_saved_random_init_checkpoint(ckpt, tmp_path):
    """Mode "random_init" (issue 74 part 5): for each probe seed s, the same probe per layer on the
    architecture freshly initialised with seed s, extracted from the same capped records: its rows equal
    a plain "single" probe of `random_baseline_checkpoint(ckpt, seed=s)` (the same weights saved)."""
    # probe seeds 1 and 2: the fixture's untrained model was itself drawn with torch seed 0, so the random-init
    # model of seed 0 would be the same model
    cfg = {**CFG, "tasks": ["pos"], "modes": ["single", "random_init"], "seeds": [1, 2]}
    got = probe_model(ckpt, out_dir=tmp_path / "a", config=cfg, progress=False)["probing"]
    ri = got[got["mode"] == "random_init"]
    assert sorted(ri["layer"].unique()) == [0, 1, 2] and sorted(ri["seed"].unique()) == [1, 2]
    for seed in (1, 2):
        base = random_baseline_checkpoint(ckpt, tmp_path / f"rand{seed}", seed=seed)
        ref = probe_model(base, out_dir=tmp_path / f"b{seed}", config={**cfg, "modes": ["single"], "seeds": [seed]},
                          progress=False)["probing"]
        ref = ref[(ref["mode"] == "single") & (ref["seed"] == seed)].set_index(["layer", "metric"])["value"]
        mine = ri[ri["seed"] == seed].set_index(["layer", "metric"])["value"]
        pd.testing.assert_series_equal(mine.sort_index(), ref.sort_index(), rtol=1e-6)
    # the fixture's model is untrained too, with other weights: its scores are not the random-init ones
    own = got[(got["mode"] == "single") & (got["seed"] == 1)].set_index(["layer", "metric"])["value"].sort_index()
    assert not np.allclose(own.to_numpy(), ri[ri["seed"] == 1].set_index(["layer", "metric"])["value"]
                           .sort_index().to_numpy())


@pytest.mark.slow
def test_the_random_init_floor_is_drawn_under_the_checkpoints_training_seed(ckpt, tmp_path):
    """Two checkpoints of one architecture pretrained under seeds t = 0 and 1 (their cards say so), probed
    with seed s = 1, get the floors `random_init_model(model, t + s)`: seed 1 for t = 0 (today's floor,
    the probe seed's own) and seed 2 for t = 1, so the two floors differ. The run record names the seeds."""
    model, tok = plmodels.load(ckpt)
    cfg = {**CFG, "tasks": ["pos"], "modes": ["random_init"], "seeds": [1], "layers": [1], "n_boot": 0,
           "max_train_targets": 100, "max_eval_targets": 50, "max_epochs": 1}
    floors = {}
    for t in (0, 1):
        path = plmodels.save(model, tok, tmp_path / f"trained-s{t}", card={"seed": t})
        got = probe_model(path, out_dir=tmp_path / f"p{t}", config=cfg, progress=False)["probing"]
        floors[t] = got[got["mode"] == "random_init"].set_index(["layer", "metric"])["value"].sort_index()
        assert json.loads((tmp_path / f"p{t}" / "probe_run.json").read_text())["random_init_seeds"] == {"1": t + 1}
    for t in (0, 1):  # pinned against the network drawn directly, probed as a plain model
        fresh = plmodels.save(random_init_model(model, t + 1), tok, tmp_path / f"fresh{t + 1}")
        ref = probe_model(fresh, out_dir=tmp_path / f"r{t}", config={**cfg, "modes": ["single"]},
                          progress=False)["probing"]
        ref = ref[ref["mode"] == "single"].set_index(["layer", "metric"])["value"].sort_index()
        pd.testing.assert_series_equal(floors[t], ref, rtol=1e-6)
    assert not np.allclose(floors[0].to_numpy(), floors[1].to_numpy())
