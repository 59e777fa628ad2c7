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
PAGES = [  # (file, title, url path, icon)
    ("pages/runs.py", "Runs and models", "runs", ":material/folder_open:"),
    ("pages/layers.py", "Layers", "layers", ":material/layers:"),
    ("pages/heads.py", "Heads", "heads", ":material/grid_view:"),
    ("pages/pruning.py", "Pruning", "pruning", ":material/content_cut:"),
    ("pages/compare.py", "Finetuned vs frozen", "compare", ":material/compare_arrows:"),
    ("pages/playground.py", "Playground", "playground", ":material/edit_note:"),
]

st.set_page_config(page_title="plm-workbench", layout="wide")
nav = st.navigation([st.Page(HERE / f, title=t, url_path=u, icon=i, default=k == 0)
                     for k, (f, t, u, i) in enumerate(PAGES)])
st.sidebar.caption(f"Results: `{common.results_root()}`")
common.select_run()
nav.run()
