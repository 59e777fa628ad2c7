"""core: what every other layer of the workbench stands on, and nothing above it.

Atomic file writes (`io`), where the data lives (`paths`), a long loop's resident memory kept flat
(`memory`) and the results store of a run: tidy Parquet tables, model listings and run records
(`results`). It imports no other layer. Progress bars
come from `plmodels.progress`. (Configs are typed by `plmodels.config`, shared by every package.)
"""
