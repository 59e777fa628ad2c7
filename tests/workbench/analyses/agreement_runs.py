"""A shared test helper (not a test module): a tiny decoder checkpoint whose tokenizer knows every word
of the agreement templates as one token, so the agreement items survive tokenisation, and the tables
`workbench.analyses.interventions.interventions_model` writes for it."""
from __future__ import annotations

from pathlib import Path

import torch

import plmodels
from plmodels import Decoder, DecoderConfig
from plmodels.tokenizer import Tokenizer
from workbench.analyses.interventions import interventions_model
from workbench.data.pair_templates import INTRANSITIVE, NOUNS, OTHER_NOUNS, PREPOSITIONS, SAY_VERBS, TRANSITIVE

CFG = {"n_per_template": 8, "n_boot": 50, "batch_size": 16}


def agreement_decoder(folder: Path) -> Path:
    """Save a 2-layer, 2-head decoder (seed 1, not the random-init floor's 0) to `folder`."""
    words = [w for pair in NOUNS + OTHER_NOUNS + INTRANSITIVE + TRANSITIVE for w in pair]
    tok = Tokenizer.train_bpe([" ".join(["The", "the", "that", ".", *PREPOSITIONS, *SAY_VERBS, *words])] * 30,
                              vocab_size=1000)
    torch.manual_seed(1)
    model = Decoder(DecoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                  max_positions=64)).eval()
    plmodels.save(model, tok, folder)
    return folder


def agreement_run(run_dir: Path, name: str = "agr-dec") -> Path:
    """The checkpoint under run_dir/models/<name> and its interventions tables in run_dir/tables."""
    folder = agreement_decoder(Path(run_dir) / "models" / name)
    interventions_model(folder, out_dir=run_dir, config=CFG, model_name=name)
    return folder
