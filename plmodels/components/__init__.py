"""The parts every model family shares, so that a family file (encoder.py, decoder.py, and the
electra.py, albert.py, t5.py ... to come) holds only its own model: config -> MLP -> block ->
embeddings -> heads -> model, read top to bottom.

| module            | what every family takes from it                                            |
|-------------------|----------------------------------------------------------------------------|
| attention.py      | the attention kernel (eager and SDPA paths), masks, unpadding (`Packing`), the fused-QKV sub-layer with head pruning |
| positions.py      | RoPE tables and ALiBi slopes and distances                                 |
| dropout.py        | dropout with the cheaper CPU mask                                          |
| hooks.py          | `HookPoint`, `HookedModel` (`hooks`, `run_with_cache`): the public hook sites |
| outputs.py        | the forward passes' output dataclasses                                     |
| model_config.py   | the checks of the fields all configs share, the config.json round trip     |
| layers.py         | activations by name, the LayerNorm factory, the BERT / GPT-2 init          |
| pruning.py        | `PrunableMixin`: `prune_heads`, `n_heads_per_layer`, the head-mask check   |
| inputs.py         | the length check and `packing_for` (unpad=True)                            |
| norms.py          | per-head value-vector norms ||f_h(x_j)|| (Kobayashi et al. 2020), `record_value_norms` |
| cpu_linear.py     | `onednn_linear`: an inference forward's linear layers on oneDNN (2x MKL's fp32 GEMM on AMD CPUs) |

Checkpoint I/O is shared too, one level up (checkpoint.py: a family registers its class in
`MODEL_KINDS`). The name follows TransformerLens' `components/`; a subpackage, not more files at
the top, so that plmodels/ itself lists the families, the tokenizer and checkpoints.

What is shared and what is not (STYLE.md: "share infrastructure, not model semantics"): what is
here is the machinery that must behave the same in every family for the workbench to treat
models alike -- one attention kernel whose eager path gives probabilities and honours head masks,
one hook table, one way to prune, one config.json schema. The MLP and the block are *not* here:
each family file writes its own. They are where families differ (post- or pre-LN, GELU or GEGLU,
ALBERT's block shared across depth, T5's RMSNorm and relative bias, BART's cross-attention,
XLNet's two streams), and a reader of one family should see its whole forward pass in one file
(Hugging Face's one-file-per-model policy). The price is that BERT's and GPT-2's MLP and block,
which take the same config options, are written twice (about 40 lines); a shared block would make
every future family either fit its options or grow flags in a file all families depend on.
Nothing in components/ imports a family file.
"""
