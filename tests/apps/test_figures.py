"""Figure builders, without Streamlit: the traces carry the planted values, the attention views
stay small for long sentences, categorical grids map codes to the right colours."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from tests.apps.fixtures import PEAK_LAYER
from workbench import figures as F
from workbench.figures.attention import MAX_WORDS, _segments
from workbench.presentation import views
from workbench.presentation.views import HeadGrid, SentenceAttention


def test_layer_scores_one_line_per_model_and_task(run_dir):
    fig = F.layer_scores_figure(views.layer_scores(run_dir))
    assert len(fig.data) == 2 * 3
    pos_enc = next(t for t in fig.data if t.name == "enc" and t.xaxis == "x3")   # tasks sorted: deps, ner, pos
    assert int(np.argmax(pos_enc.y)) == PEAK_LAYER["pos"]
    assert sum(t.showlegend for t in fig.data) == 2                              # one legend entry per model


def test_pipeline_orders_tasks_by_expected_layer(run_dir):
    mix, summ = views.mix_weights(run_dir), views.layer_summary(run_dir)
    fig = F.pipeline_figure(mix[mix["model"] == "enc"], summ[summ["model"] == "enc"])
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["pos", "deps", "ner"]
    markers = [t for t in fig.data if t.name == "expected layer"]
    assert [round(t.x[0]) for t in markers] == [3, 6, 9]


def test_role_grid_uses_a_step_colour_scale():
    grid = HeadGrid("m", "role", np.array([[0.0, 1.0], [1.0, np.nan]]),
                    np.array([["none", "syntactic"], ["syntactic", ""]], dtype=object), ("none", "syntactic"))
    fig = F.head_grid_figure(grid)
    hm = fig.data[0]
    assert hm.zmin == -0.5 and hm.zmax == 1.5 and list(hm.colorbar.ticktext) == ["none", "syntactic"]
    assert hm.colorscale[0][1] == hm.colorscale[1][1] == "#e6e6e6"            # code 0 -> colour of none
    assert hm.colorscale[2][1] == "#d62728"                                    # code 1 -> syntactic red
    assert fig.layout.yaxis.autorange == "reversed"


def test_role_subtypes_get_distinct_colours():
    # the report showed every syntactic:<relation> head in the same red
    roles = ["none", "positional", "syntactic:det", "syntactic:nsubj", "syntactic:amod", "sink"]
    colors = F.heads.role_colors(roles)
    assert colors["none"] == "#e6e6e6" and colors["positional"] == "#1f77b4"
    syn = [colors[r] for r in roles if r.startswith("syntactic")]
    assert len(set(syn)) == 3 and "#d62728" in syn                     # the first in the family's red
    assert len(set(colors.values())) == len(roles)


def test_segments_are_none_separated_lines():
    mask = np.array([[True, False], [False, True], [True, True]])
    xs, ys = _segments(mask)
    assert xs == [0.0, 1.0, None] * 4
    assert ys == [0, 0, None, -1, -1, None, -2, 0, None, -2, -1, None]


def _sentence(n: int, L: int = 12, H: int = 12) -> SentenceAttention:
    rng = np.random.default_rng(0)
    a = rng.dirichlet(np.ones(n) * 0.2, size=(L, H, n)).astype(np.float32)
    return SentenceAttention([f"w{i}" for i in range(n)], a, [(i, i + 1, "dep") for i in range(n - 1)])


def test_attention_lines_few_traces_and_exact_segment_count():
    sa = _sentence(30)
    fig = F.attention_lines(sa, layer=5, heads=[0, 3], threshold=0.1, n_bins=4)
    lines = [t for t in fig.data if t.mode == "lines" and t.name.startswith("head")]
    assert len(lines) <= 2 * 4
    n_segments = sum(sum(x is None for x in t.x) for t in lines)
    assert n_segments == int((sa.attn[5, [0, 3]] >= 0.1).sum())
    arcs = next(t for t in fig.data if t.name.startswith("dependency"))
    assert sum(x is None for x in arcs.x) == 29


def test_long_sentences_are_capped():
    sa = _sentence(150, L=2, H=2)
    heat = F.attention_heatmap(sa, 1, 1)
    assert np.asarray(heat.data[0].z).shape == (MAX_WORDS, MAX_WORDS)
    assert all(d < MAX_WORDS and h < MAX_WORDS for d, h in zip(heat.data[1].y, heat.data[1].x))
    lines = F.attention_lines(sa, 1)
    assert len(lines.data[-1].text) == MAX_WORDS


@pytest.mark.parametrize("builder", ["pruning", "speed", "fvf", "cka", "delta", "training", "relations", "map"])
def test_other_figures_carry_the_table_values(run_dir, builder):
    if builder == "pruning":
        df = views.pruning_curves(run_dir, "accuracy")
        fig = F.pruning_curves_figure(df)
        assert {t.name for t in fig.data if t.mode == "lines+markers"} == {"michel", "ablation", "random"}
    elif builder == "speed":
        fig = F.speed_figure(views.table(run_dir, "pruned_speed"))
        assert list(fig.data[2].y) == [100.0, 140.0]
    elif builder == "fvf":
        fig = F.fvf_figure(views.frozen_vs_finetuned(run_dir))
        assert {t.name: tuple(t.y) for t in fig.data} == {"finetuned": (0.9, 0.9), "frozen": (0.7, 0.7)}
    elif builder == "cka":
        m = views.cka_matrix(run_dir, "enc", "enc-ft", "linear")
        fig = F.cka_diagonal_figure(m, "a", "b")
        assert np.allclose(fig.data[0].y, np.diag(m))
        assert np.allclose(F.cka_heatmap(m, "a", "b").data[0].z, m)
    elif builder == "delta":
        fig = F.probing_delta_figure(views.probing_deltas(run_dir, "enc", "enc-ft"), "enc", "enc-ft")
        assert len(fig.data) == 3 and np.allclose(fig.data[0].y, 0.02)
    elif builder == "training":
        fig = F.training_figure(views.training_curves(run_dir))
        assert {t.name for t in fig.data} == {"enc train", "enc dev"}
    elif builder == "relations":
        best = views.best_heads(run_dir, "enc")
        fig = F.relations_figure(best)
        head = fig.data[1]                                  # horizontal bars, sorted by the head's accuracy
        assert "2-5" in head.text and head.orientation == "h" and list(head.x) == sorted(best["test_acc"])
    else:
        fig = F.head_map_figure(views.head_map(run_dir, "enc"))
        assert sum(len(t.x) for t in fig.data if t.mode == "markers") == 144
    assert isinstance(fig, go.Figure)


def test_fvf_figure_draws_every_setting_of_the_real_table_and_leaves_out_the_differences():
    # the main job writes five frozen settings, the finetuned one and a "diff:" row per frozen setting:
    # more settings than the palette has colours (this raised IndexError in the app)
    frozen = ["last", "mean_last", "layer:-2", "scalar_mix", "concat_last4"]
    sets = frozen + ["finetune"] + [f"diff:{s}" for s in frozen]
    df = pd.DataFrame([dict(model="m", task="sst2", metric="accuracy", setting=s, value=0.5 + 0.01 * i,
                            ci_low=np.nan if s == "finetune" else 0.4, ci_high=np.nan if s == "finetune" else 0.9)
                       for i, s in enumerate(sets)])
    fig = F.fvf_figure(df)
    assert [t.name for t in fig.data] == frozen + ["finetune"]
    assert [t.y[0] for t in fig.data] == pytest.approx([0.5 + 0.01 * i for i in range(6)])
