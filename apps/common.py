"""What every page shares: the results root, the run picker, cached library calls, empty states.

Caching follows the Streamlit docs: tables (and what views shape from them) with st.cache_data keyed
by strings (the view's name, the run folder, the tables' modification time and plain arguments);
models with st.cache_resource, as read-only objects shared by all sessions.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import streamlit as st

from plmodels.families import family
from workbench.core import results
from workbench.presentation import views

ENV_RESULTS = "WORKBENCH_RESULTS"


def results_root() -> Path:
    """The results root: `--results` after `--` on the streamlit command line, else $WORKBENCH_RESULTS,
    else runs/."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--results")
    known, _ = p.parse_known_args(sys.argv[1:])
    return Path(known.results or os.environ.get(ENV_RESULTS) or "runs")


def select_run() -> str | None:
    """The run picker (sidebar); the chosen run folder is kept in st.session_state["run_dir"]."""
    root = results_root()
    runs = results.list_runs(root)
    if not runs:
        st.session_state["run_dir"] = None
        return None
    run = st.sidebar.selectbox("Run", runs, key="run")
    st.session_state["run_dir"] = str(root / run)
    return st.session_state["run_dir"]


def current_run() -> str | None:
    """The selected run folder; says which command creates one when the results root is empty."""
    # The entry file (apps/app.py) picks the run before the page runs; a page run alone picks it here.
    run = st.session_state["run_dir"] if "run_dir" in st.session_state else select_run()
    if run is None:
        st.info(f"No runs under `{results_root()}` yet. Create one with `workbench run configs/demo.json` "
                f"(or point the app at another folder: `workbench app --results FOLDER`).")
    return run


@st.cache_data(show_spinner=False, max_entries=256)
def _cached_view(name: str, run_dir: str, stamp: float, args: tuple):
    return getattr(views, name)(run_dir, *args)


def view(name: str, run_dir: str, *args):
    """`workbench.presentation.views.<name>(run_dir, *args)`, cached by strings until the run's tables change."""
    return _cached_view(name, str(run_dir), views.table_stamp(run_dir), tuple(args))


def no_results(table: str, what: str | None = None) -> None:
    """The empty state: which CLI command produces the missing results."""
    st.info(f"No {what or table} results in this run yet. Produce them with `{views.missing_command(table)}`.")


@st.cache_resource(show_spinner="Loading model...", max_entries=4)
def model(path: str):
    """(model, tokenizer) of a checkpoint folder, loaded once and shared read-only."""
    return views.load_model.__wrapped__(path)


@st.cache_data(show_spinner="Running the model...", max_entries=64)
def attention_for_text(path: str, text: str, weighting: str = "raw"):
    """Word-level attention of a typed sentence; weighting "raw" or "norm" (Kobayashi et al. 2020)."""
    m, tok = model(path)
    return views.attention_for_text(path, text, model=m, tokenizer=tok, weighting=weighting)


@st.cache_data(show_spinner=False, max_entries=64)
def stored_attention(run_dir: str, name: str, s: int, weighting: str = "raw"):
    """Sentence s of the run's attention store; "norm" runs the run's checkpoint of that name."""
    return views.stored_attention(run_dir, name, s, weighting)


def choose(label: str, options: dict, key: str):
    """A selectbox over the labels of `options` ({label: value}); returns the chosen value. Labels,
    not a format_func, are what the widget holds, so its state is plain text (and AppTest can set it)."""
    return options[st.selectbox(label, list(options), key=key)]


def pick(label: str, options: list, key: str, index: int = 0):
    """A selectbox that returns None (and shows nothing) when there is nothing to choose."""
    if not options:
        return None
    return st.selectbox(label, options, index=min(index, len(options) - 1), key=key)


@st.cache_data(show_spinner="Running the model...", max_entries=64)
def predictions(path: str, kind: str, text: str, k: int):
    """Masked-token predictions (encoder) or (continuation, next-token table) (decoder), cached."""
    m, tok = model(path)
    if family(kind).lm_inputs == "masked":
        return views.masked_predictions(m, tok, text, k=k)
    return views.continuations(m, tok, text, n_new=20, k=k)
