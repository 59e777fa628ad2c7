"""store: the activation store, model vectors on disk.

Runs a model over sentences once and keeps what the analyses read: per-layer word (or span)
vectors, word-level attention maps and their special-token columns, in memory-mapped arrays keyed
by the checkpoint's hash, the data and the pooling. Imports `core` and `data`.

One module per job, each importing only those above it in this list:

    pooling         PoolPlan, POOLINGS                      a word's vector from its subwords' vectors
    batching        make_batches, build_batch, Batch        length-sorted, token-budgeted batches
    word_attention  word_attention_maps,                    token -> word attention (Clark et al. 2019)
                    special_token_columns
    store           Store, INDEX_FILE, STORE_VERSION        the folder's layout, read through memmaps
    keys            store_key, store_dir, data_hash,        which folder holds which vectors
                    model_fingerprint
    budget          estimate_bytes, Estimate, BudgetError   disk and RAM needed, refused when over
    extraction      extract, forward_layers,                model -> store, and `workbench extract`
                    load_sentences, extract_cli
    probe_inputs    extract_task, task_arrays, TaskArrays   a task's targets as global word rows

The names most callers need are importable from the package itself.
"""

from workbench.store.budget import BudgetError
from workbench.store.extraction import PRECISIONS, extract, forward_layers, load_sentences
from workbench.store.pooling import POOLINGS
from workbench.store.probe_inputs import TaskArrays, extract_task, task_arrays
from workbench.store.store import INDEX_FILE, Store
from workbench.store.word_attention import special_token_columns, word_attention_maps

__all__ = ["INDEX_FILE", "POOLINGS", "PRECISIONS", "BudgetError", "Store", "TaskArrays", "extract",
           "extract_task", "forward_layers", "load_sentences", "special_token_columns", "task_arrays",
           "word_attention_maps"]
