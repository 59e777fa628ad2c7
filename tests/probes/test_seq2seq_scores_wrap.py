"""The seq2seq minimal-pair scorers build their rows in the checkpoint's own tokenizer wrap: an
imported T5, whose tokenizer has no [CLS] or [SEP] and ends a sequence with </s>, is scored as
transformers scores it (encoder <extra_id_0> </s>, target <extra_id_0> body </s>, decoding from
<pad>), while the workbench's own WordPiece models keep [CLS] .. [SEP] (tests/probes/test_sentence_scores.py)."""
from __future__ import annotations

import warnings

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from plmodels.hf.registry import import_hf
from plmodels.tokenizer import Tokenizer
from probes.sentence_scores import SCORERS, t5_target_scores
from tests.plmodels.hf_models import SEQ2SEQ_VOCAB, hf_t5

SENTENCES = [["w3", "w10", "w7"], ["w40", "w41"], ["w5", "w6", "w7", "w8"]]


def t5_tokenizer() -> Tokenizer:
    """T5's layout: <pad>=0, </s>=1, <unk>=2, the sentinels last (<extra_id_0> the highest id), and
    the wrap T5Tokenizer adds (nothing before, </s> after)."""
    pieces = ["<pad>", "</s>", "<unk>"] + [f"\u2581w{i}" for i in range(3, SEQ2SEQ_VOCAB - 3)]
    pieces += [f"<extra_id_{i}>" for i in (2, 1, 0)]
    hf = HFTokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=2))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.add_special_tokens(["<pad>", "</s>", "<unk>"] + [f"<extra_id_{i}>" for i in range(3)])
    return Tokenizer(hf, "unigram", {"eos": "</s>", "unk": "<unk>", "pad": "<pad>"}, affixes=((), ("eos",)))


def test_an_imported_t5_is_scored_in_its_own_wrap_as_transformers_scores_it(tmp_path):
    ref = hf_t5(seed=0)
    ref.save_pretrained(tmp_path / "t5")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")           # no tokenizer files in the folder: said in a warning
        model, _ = import_hf(tmp_path / "t5")
    tok = t5_tokenizer()
    encs = [tok.encode_words(words) for words in SENTENCES]
    assert all(e.ids[-1] == 1 and len(e.ids) == len(w) + 1 for e, w in zip(encs, SENTENCES))  # body </s>
    x0 = tok.hf.token_to_id("<extra_id_0>")
    want = []
    with torch.no_grad():
        for e in encs:
            body = e.ids[:-1]
            labels = torch.tensor([[x0] + body + [1]])
            logits = ref(input_ids=torch.tensor([[x0, 1]]), labels=labels).logits   # decodes from <pad> (0)
            logp = torch.log_softmax(logits.float(), -1)[0, torch.arange(labels.shape[1]), labels[0]]
            want.append(float(logp[1:1 + len(body)].sum()))
    got = t5_target_scores(model, encs, tok)
    assert got.tolist() == pytest.approx(want, abs=1e-4)
    # the sentinel scorer runs in the same wrap: finite log-probabilities that tell the two forms apart
    pairs = [(["w3", "w10", "w7"], ["w3", "w11", "w7"], 1)]
    scores = SCORERS["t5_sentinel"].score_pairs(model, tok, pairs)
    assert (scores < 0).all() and scores[0, 0] != scores[0, 1]
