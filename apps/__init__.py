"""apps: the Streamlit app, a thin shell over `workbench.presentation` and `workbench.figures`.

    app.py             the entry file: picks the run and routes to the pages (st.navigation)
    common.py          what every page shares: results root, run picker, cached library calls
    attention_view.py  the sentence-attention widget of the Heads and Playground pages
    app_pages/         one file per page (see its docstring)

Each page is widgets -> one workbench call -> one Plotly figure; no page does tensor math.
"""
