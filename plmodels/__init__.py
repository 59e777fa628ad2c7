"""plmodels: own transformer models (BERT-style encoder, GPT-2-style decoder), tokenizers, checkpoints.

Light on purpose: importing plmodels never imports transformers or streamlit.

The layout: one file per architecture, read top to bottom (config -> MLP -> block -> model), on
shared parts that are written once; a paper's variant is a flag of its file (docs/design.md's
paper -> file -> flags table), and what differs per family is one record in families.py.

    encoder.py      the BERT-style encoder (EncoderConfig, Encoder)
    decoder.py      the GPT-2-style decoder (DecoderConfig, Decoder)
    elmo.py         ELMo's biLSTM language model (ElmoConfig, ElmoBiLM), its loss, and its
                    transformer control (TransformerBiLMConfig, TransformerBiLM)
    seq2seq.py      the T5 / BART encoder-decoder (Seq2SeqConfig, Seq2Seq); analyses read its encoder
    xlnet.py        XLNet's two-stream relative-position model (XLNetConfig, XLNet); analyses read
                    its content stream
    electra.py      ELECTRA's generator and discriminator pair, trained as one model
    components/     what every family shares: attention kernel, positions, dropout, hook sites,
                    outputs, config checks, init, head pruning, input checks (see its docstring)
    families.py     the family registry: one record per kind (classes, default objective, LM
                    statistic, head grid, analysis forward), the AnalysedModel protocol
    checkpoint.py   save / load / hash a checkpoint folder; the typed card (Card, read_card)
    hf/             the Hugging Face importers (one per model_type, by config.json) and the exporter
                    (see its docstring)
    tokenizer.py    WordPiece, byte-level BPE and SentencePiece Unigram tokenizers
    presets.py      named model shapes (tiny, mini, small, base)
    config.py       the typed loader of run configs
    files.py        the one atomic writer: files (safetensors, JSON, text), folder swaps and copies,
                    with the mode open() gives; the cleanup of what a killed writer left
    progress.py     progress bars with rate and ETA for long steps
    paths.py        where the shared data lives ("${WORKBENCH_DATA}") and whether the code runs from a
                    source checkout
    recipes/        the shipped pretraining and finetuning configs, found by name (package data)
    training/       pretraining and finetuning: config, corpus, masking, schedule, data, loss,
                    runtime, distributed, state, evaluation, loop, finetune (see its docstring)
"""

from .checkpoint import checkpoint_hash, load, save
from .decoder import Decoder, DecoderConfig
from .elmo import ElmoBiLM, ElmoConfig, TransformerBiLM, TransformerBiLMConfig
from .encoder import Encoder, EncoderConfig
from .seq2seq import Seq2Seq, Seq2SeqConfig
from .xlnet import XLNet, XLNetConfig

__all__ = ["Encoder", "EncoderConfig", "Decoder", "DecoderConfig", "ElmoBiLM", "ElmoConfig", "TransformerBiLM",
           "TransformerBiLMConfig", "Seq2Seq", "Seq2SeqConfig", "XLNet", "XLNetConfig",
           "save", "load", "checkpoint_hash"]
