"""store: the activation store, model vectors on disk.

Runs a model over sentences once and keeps what the analyses read: per-layer word (or span)
vectors, word-level attention maps and their special-token columns, in memory-mapped arrays keyed
by the checkpoint's hash, the data and the pooling (`activations`). Imports `core` and `data`.
"""
