"""Plotly figure builders: plain functions from a tidy table (or a small frame shaped from one by
`workbench.presentation.views`) to a `plotly.graph_objects.Figure`.

One builder per figure, shared by the analysis commands (the figures they write beside their
tables), the report and the app; none reads files or runs models, so any run's tables can be drawn
again and every builder is tested without Streamlit.

    layers.py     training curves, per-layer probing scores, mixing weights, the pipeline summary
    heads.py      the layer x head grid, best head per relation, the head similarity map
    attention.py  one head's (or one layer's) attention on a sentence, with dependency arcs
    compare.py    pruning curves, pruned speed and size, frozen vs finetuned, CKA, probing deltas
    emergence.py  probe and head scores against the tokens a model has seen
    pairs.py      minimal-pair accuracies and structural-probe scores beside their floors
    causal.py     structural probes per layer, amnesic probing and head gating against their random controls
    flow.py       MI and lens curves per layer, attribution faithfulness, beside their floors
    interventions.py  indirect effects per layer and head beside their floors, one item's patched runs
    zoo.py        the zoo: scores by layer of systems that differ only in their objective
"""

from workbench.figures.attention import attention_heatmap, attention_lines
from workbench.figures.causal import amnesic_figure, gating_figure, passport_figure, structural_figure
from workbench.figures.compare import (
                                       cka_diagonal_figure,
                                       cka_heatmap,
                                       fvf_figure,
                                       probing_delta_figure,
                                       pruning_curves_figure,
                                       speed_figure,
)
from workbench.figures.emergence import emergence_figure
from workbench.figures.flow import (flow_attribution_figure, flow_lens_figure, flow_mi_figure, flow_sentence_figure,
                                    zoo_flow_figure)
from workbench.figures.interventions import (interventions_heads_figure, interventions_layers_figure,
                                             interventions_positions_figure)
from workbench.figures.heads import head_grid_figure, head_map_figure, relations_figure
from workbench.figures.pairs import attractors_figure, pairs_figure, probe_behaviour_figure, structural_floors_figure
from workbench.figures.layers import (
                                       cumulative_figure,
                                       layer_scores_figure,
                                       mix_weights_figure,
                                       pipeline_figure,
                                       predictions_figure,
                                       summary_figure,
                                       training_figure,
)

__all__ = [
    "attention_heatmap", "attention_lines", "cka_diagonal_figure", "cka_heatmap", "fvf_figure",
    "probing_delta_figure", "pruning_curves_figure", "speed_figure", "emergence_figure", "head_grid_figure",
    "head_map_figure", "relations_figure", "cumulative_figure", "layer_scores_figure", "mix_weights_figure",
    "pipeline_figure", "predictions_figure", "summary_figure", "training_figure", "attractors_figure",
    "pairs_figure", "probe_behaviour_figure", "structural_floors_figure", "flow_mi_figure", "flow_lens_figure", "flow_attribution_figure", "zoo_flow_figure",
    "flow_sentence_figure", "interventions_layers_figure", "interventions_heads_figure", "interventions_positions_figure", "structural_figure",
    "amnesic_figure", "gating_figure", "passport_figure",
]
