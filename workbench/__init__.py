"""workbench: data, the activation store, analyses, reports and the command line, over `plmodels`
(models, tokenizers, training) and `probes` (analysis on arrays).

The package is layered; a module imports only from its own layer or the ones above it in this
list (tests/test_import_rules.py checks it on every run):

    core          io, paths, results                     atomic writes, dataset checks, run tables
    data          readers, tasks, align, finetuning      corpora -> task records
    store         pooling, batching, word_attention,     model vectors and attention maps on disk
                  store, keys, budget, extraction,
                  probe_inputs
    analyses      probing, heads, prune, compare,        one library function per question,
                  frozen_vs_finetuned, emergence         tidy tables out
    figures       layers, heads, attention, compare,     Plotly builders: table -> Figure
                  emergence
    presentation  views, analysis_figures, report        tables -> figures, pages and the report
    (entry)       cli, pipeline, zoo, engine,            `workbench ...`, `workbench run`, `workbench zoo`,
                  app_launcher                           `workbench study` (steps on Dask), `workbench app`

The app (`apps/`) sits above all of it and imports `workbench.presentation` and `workbench.figures`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("plm-workbench")
except PackageNotFoundError:   # a source tree on sys.path, not installed
    __version__ = "0+unknown"
