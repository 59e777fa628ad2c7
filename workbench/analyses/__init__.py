"""analyses: the questions the workbench asks of a model, each one library function that returns tidy
tables (docs/design.md, "Result tables") and writes them atomically into a run.

`probing` (edge probes per layer, scalar mix, controls, MDL), `heads` (head roles and the best head
per relation), `prune` (importance, pruning curves, real pruning), `compare` (CKA, head change,
probing change), `frozen_vs_finetuned`, `emergence` (scores over pretraining checkpoints). They
import `core`, `data` and `store`, and draw no figures: that is the presentation layer's job.
"""
