"""Imported GPT-2, RoBERTa, ALBERT and BART checkpoints (random, built with transformers, with their own
BPE / Unigram tokenizer files; ALBERT's one layer shared by both depths; BART's encoder is what the
analyses read) run through the analyses unchanged: `import_hf` picks the family from config.json,
and probing (pos, arcs) and the head analysis write their tables on real EWT sentences."""
from __future__ import annotations

import pytest
import torch

from plmodels.hf.registry import import_hf
from plmodels.tokenizer import albert_pipeline
from tests.plmodels.hf_files import unigram_folder
from tests.plmodels.hf_files import write_gpt2_files, write_roberta_files
from workbench.analyses.heads import analyse_heads
from workbench.analyses.probing import probe_model
from workbench.core.paths import data_root

transformers = pytest.importorskip("transformers")   # the reference builds the checkpoints
pytestmark = pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")

PROBE = dict(tasks=["pos", "arcs"], modes=["single", "control"], seeds=[0], max_train_targets=300,
             max_eval_targets=150, max_epochs=2, n_boot=0, hidden=16, proj_dim=16)
HEADS = {"max_sentences": 40, "n_boot": 10, "freq_max_chars": 20000, "similarity_max_words": 100}


def _gpt2(folder):
    n = write_gpt2_files(folder)
    cfg = transformers.GPT2Config(vocab_size=n, n_embd=32, n_layer=2, n_head=2, n_positions=128,
                                  bos_token_id=n - 1, eos_token_id=n - 1)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)


def _roberta(folder):
    n = write_roberta_files(folder)
    cfg = transformers.RobertaConfig(vocab_size=n, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=48, max_position_embeddings=130, pad_token_id=1,
                                     bos_token_id=0, eos_token_id=2, type_vocab_size=1)
    torch.manual_seed(0)
    transformers.RobertaForMaskedLM(cfg).save_pretrained(folder)


def _albert(folder):
    unigram_folder(folder, *albert_pipeline()[:2])
    n = len(transformers.AutoTokenizer.from_pretrained(str(folder)))
    cfg = transformers.AlbertConfig(vocab_size=n, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=48, max_position_embeddings=128)
    torch.manual_seed(0)
    transformers.AlbertForMaskedLM(cfg).save_pretrained(folder)


def _bart(folder):
    n = write_roberta_files(folder)  # BART's tokenizer is RoBERTa's byte-level BPE
    cfg = transformers.BartConfig(vocab_size=n, d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=48,
                                  decoder_ffn_dim=48, max_position_embeddings=128, pad_token_id=1, bos_token_id=0,
                                  eos_token_id=2, decoder_start_token_id=2)
    torch.manual_seed(0)
    transformers.BartForConditionalGeneration(cfg).save_pretrained(folder)


@pytest.mark.slow
@pytest.mark.parametrize("family,build,kind", [("gpt2", _gpt2, "decoder"), ("roberta", _roberta, "encoder"),
                                               ("albert", _albert, "encoder"), ("bart", _bart, "seq2seq")])
def test_an_imported_family_runs_through_probing_and_heads(tmp_path, one_thread, family, build, kind):
    src = tmp_path / "hf"
    build(src)
    model, tok = import_hf(src, tmp_path / "run" / "models" / family)
    assert model.kind == kind and tok is not None
    probing = probe_model(tmp_path / "run" / "models" / family, out_dir=tmp_path / "run", config=PROBE,
                          progress=False)["probing"]
    assert set(probing["task"]) == {"pos", "arcs"}
    assert set(probing["layer"][probing["mode"] == "single"]) == {0, 1, 2}
    acc = probing[(probing["metric"] == "accuracy") & (probing["mode"] == "single")]["value"]
    assert acc.between(0, 1).all()
    heads = analyse_heads(tmp_path / "run" / "models" / family, out_dir=tmp_path / "run", config=HEADS, progress=False)
    assert {"heads", "heads_classes", "relations"} <= set(heads)
    assert len(heads["heads_classes"].drop_duplicates(["layer", "head"])) == 4      # 2 layers x 2 heads
