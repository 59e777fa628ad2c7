"""presentation: tables in, pictures and pages out.

`views` reads a run's tables (and, for the app's playground, runs a model on one typed sentence)
and shapes them for one figure; `analysis_figures` draws the figures each analysis command writes
beside its tables; `report` writes the self-contained HTML report and its Markdown summary. The
figure builders themselves are `workbench.figures`. Nothing here computes a result table.
"""
