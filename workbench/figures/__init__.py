"""Plotly figure builders for the app: plain functions of small tables, tested without Streamlit.

Every builder takes what a `workbench.views` function returns (a DataFrame, an array, a HeadGrid or
a SentenceAttention) and returns a `plotly.graph_objects.Figure`; none reads files or runs models.
"""

from workbench.figures.attention import attention_heatmap, attention_lines
from workbench.figures.compare import (cka_diagonal_figure, cka_heatmap, fvf_figure, probing_delta_figure,
                                  pruning_curves_figure, speed_figure)
from workbench.figures.heads import head_grid_figure, head_map_figure, relations_figure
from workbench.figures.layers import (layer_scores_figure, mix_weights_figure, pipeline_figure,
                                 predictions_figure, summary_figure, training_figure)

__all__ = [
    "attention_heatmap", "attention_lines", "cka_diagonal_figure", "cka_heatmap", "fvf_figure",
    "probing_delta_figure", "pruning_curves_figure", "speed_figure", "head_grid_figure",
    "head_map_figure", "relations_figure", "layer_scores_figure", "mix_weights_figure",
    "pipeline_figure", "predictions_figure", "summary_figure", "training_figure",
]
