"""analyses: the questions the workbench asks of a model, each one library function that returns tidy
tables (docs/design.md, "Result tables") and writes them atomically into a run.

`registry` (one record per analysis: name, config class, run function, tables; what `workbench run`,
the CLI and the app iterate over), `probing` (edge probes per layer, scalar mix, controls, MDL),
`heads` (head roles and the best head per relation), `cross_heads` (T5/BART cross-attention heads),
`prune` (importance, pruning curves, real pruning), `gating` (head-gated probing), `amnesic` (amnesic
probing), `compare` (CKA, head change, probing change), `frozen_vs_finetuned`, `emergence` (scores
over pretraining checkpoints), `minimal_pairs`, `competence` (held-out LM loss beside n-gram floors),
`zoo` (the zoo's tables), `flow` (token identity and prediction per layer, logit and tuned lens,
attention flow), `interventions` (agreement mediation by activation patching). They import `core`, `data` and `store`, and draw no figures: that is the
presentation layer's job.
"""
