"""The workbench app: one entry file that picks the run and routes to the pages (st.navigation).

Start it with `workbench app` (127.0.0.1:8501) or
`streamlit run apps/app.py -- --results runs/`; the results root comes from `--results` or
$WORKBENCH_RESULTS (default runs/).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run apps/app.py` puts apps/, not the repository, on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from apps import common  # noqa: E402

HERE = Path(__file__).parent
# The page files live in app_pages/, not pages/: Streamlit lists a pages/ folder beside the entry
# file in the sidebar by module name (app, compare, heads, ...) next to st.navigation's titles.
PAGES = [  # (file, title, url path, icon)
    ("app_pages/runs.py", "Runs and models", "runs", ":material/folder_open:"),
    ("app_pages/layers.py", "Layers", "layers", ":material/layers:"),
    ("app_pages/heads.py", "Heads", "heads", ":material/grid_view:"),
    ("app_pages/pruning.py", "Pruning", "pruning", ":material/content_cut:"),
    ("app_pages/causal.py", "Causal probes", "causal", ":material/science:"),
    ("app_pages/pairs.py", "Minimal pairs", "pairs", ":material/rule:"),
    ("app_pages/flow.py", "Flow", "flow", ":material/account_tree:"),
    ("app_pages/interventions.py", "Interventions", "interventions", ":material/swap_horiz:"),
    ("app_pages/objectives.py", "Objectives", "objectives", ":material/model_training:"),
    ("app_pages/compare.py", "Finetuned vs frozen", "compare", ":material/compare_arrows:"),
    ("app_pages/playground.py", "Playground", "playground", ":material/edit_note:"),
]

st.set_page_config(page_title="plm-workbench", layout="wide")
nav = st.navigation([st.Page(HERE / f, title=t, url_path=u, icon=i, default=k == 0)
                     for k, (f, t, u, i) in enumerate(PAGES)])
st.sidebar.caption(f"Results: `{common.results_root()}`")
common.select_run()
nav.run()
