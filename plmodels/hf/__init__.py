"""hf: Hugging Face checkpoints in and out, from the folder's own files (never a hub, never transformers).

`plmodels.hf.registry.import_hf(src, out)` reads config.json's `model_type` and hands the folder to
that family's importer (`IMPORTERS`, the one list of what can be imported; the CLI's `import-hf`
help is read off it); each importer maps the config field by field, refuses what our model cannot
compute, and reports every tensor it cannot map. docs/interop.md is the reference.

    registry.py   import_hf: model_type -> importer (IMPORTERS), the kind each builds, provenance
    common.py     the readers every importer shares (weights, sharded or not; tokenizers), import_converted
    bert.py       BERT -> Encoder (and find_minilm, the shipped all-MiniLM-L6-v2)
    encoders.py   RoBERTa, XLM-R, DistilBERT, ELECTRA, ALBERT -> Encoder
    gpt2.py       GPT-2 -> Decoder
    gpt_neox.py   GPT-NeoX (Pythia) -> Decoder (parallel residual, partial RoPE)
    seq2seq.py    T5, BART -> Seq2Seq
    xlnet.py      XLNet -> XLNet
    export.py     export_hf: our checkpoints in the Hugging Face layout (BERT, RoBERTa, DistilBERT,
                  RoFormer, ALBERT, ELECTRA, GPT-2, GPT-NeoX)
"""
