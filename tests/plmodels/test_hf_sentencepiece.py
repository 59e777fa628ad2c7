"""SentencePiece (Unigram) tokenizers of T5, XLNet and XLM-R read from a folder's tokenizer.json give
transformers' ids, and XLM-R checkpoints (RoBERTa's layout) import at parity.

The tokenizer folders are built as the ALBERT ones are (test_hf_albert.py): a tiny Unigram trained
here with the family's special tokens, wrapped in transformers' class of the family and saved with
save_pretrained. The file's own normalizer (NFKC) and pre-tokenizer differ from what each class
rebuilds, so a reader that took the file as it is gives other ids. The reference is the tokenizer
AutoTokenizer builds from that folder; the texts are the hard cases of the ALBERT and byte-level BPE
tests (accents, CJK, emoji, whitespace runs, newlines, quotes, special tokens inside running text).

transformers is used here only as the reference; plmodels never imports it."""

import json
import warnings

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers, trainers
from torch.testing import assert_close

from plmodels import load
from plmodels.hf.registry import import_hf
from plmodels.tokenizer import T5_SPECIALS, XLM_ROBERTA_SPECIALS, XLNET_SPECIALS, Tokenizer

from .hf_configs import ROBERTA_IDS, roberta_config
from .hf_files import ALBERT_EDGE as EDGE
from .hf_files import ALBERT_TEXTS as TEXTS
from .hf_files import TEXTS as BPE_TEXTS
from .hf_models import hf_t5, hf_xlnet

transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

pytestmark = pytest.mark.usefixtures("one_thread")

HARD = EDGE + TEXTS + BPE_TEXTS + [
    "The dog <mask> sat <extra_id_1>x</s> <pad>", "<s>a</s> <unk> <eod>b<eop> <sep><cls>", "  <mask>  x",
    "x <extra_id_0> y <extra_id_2>", "ǅemal ÅÅ ﬀ ½ ２０２６ ｆｕｌｌｗｉｄｔｈ",
]
# family -> (transformers class, trained specials in id order, unk index, class kwargs, our roles, affixes (roles))
FAMILIES = {
    "t5": ("T5Tokenizer", ["<pad>", "</s>", "<unk>"], 2, {"extra_ids": 3}, T5_SPECIALS, ((), ("eos",))),
    "xlnet": ("XLNetTokenizer", ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"], 0, {},
              XLNET_SPECIALS, ((), ("sep", "cls"))),
    "xlm-roberta": ("XLMRobertaTokenizer", ["<s>", "<pad>", "</s>", "<unk>"], 3, {}, XLM_ROBERTA_SPECIALS,
                    (("cls",), ("sep",))),
}


def sentencepiece_folder(folder, family: str):
    """A tiny Unigram with NFKC and a plain Metaspace (not what the family's class builds), wrapped in
    the family's transformers class and saved as save_pretrained writes it."""
    cls, specials, unk, kwargs, _, _ = FAMILIES[family]
    hf = HFTokenizer(models.Unigram())
    hf.normalizer, hf.pre_tokenizer = normalizers.NFKC(), pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=specials, unk_token=specials[unk], show_progress=False)
    hf.train_from_iterator((TEXTS + BPE_TEXTS) * 5, trainer=trainer)
    if family == "xlm-roberta":
        hf.add_special_tokens(["<mask>"])  # last, as in XLM-R's vocabulary
    getattr(transformers, cls)(tokenizer_object=hf, **kwargs).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_folder(request, tmp_path_factory):
    return sentencepiece_folder(tmp_path_factory.mktemp(request.param), request.param), request.param


def test_sentencepiece_ids_equal_transformers(family_folder):
    folder, family = family_folder
    _, _, _, _, roles, affixes = FAMILIES[family]
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert type(ref).__name__ == FAMILIES[family][0]
    ours = Tokenizer.from_hf_folder(folder)
    assert ours.kind == "unigram" and ours.specials == roles and not ours.lowercase
    for role in roles:
        assert getattr(ours, f"{role}_id") == getattr(ref, f"{role}_token_id"), role
    assert ours.vocab_size == len(ref)
    assert ours.special_affixes == tuple([ours._ids[r] for r in side] for side in affixes)
    for text in HARD:
        assert ours.encode(text) == ref(text)["input_ids"], text
        assert ours.encode(text, add_special=False) == ref(text, add_special_tokens=False)["input_ids"], text
    assert ours.encode_batch(HARD) == [ref(t)["input_ids"] for t in HARD]
    # the file as it is (its NFKC, its Metaspace) gives other ids: the rebuild is what makes parity
    as_is = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    assert any(as_is.encode(t, add_special_tokens=False).ids != ours.encode(t, add_special=False) for t in HARD)


def test_word_alignment_and_save_load_keep_the_affixes(family_folder, tmp_path):
    folder, family = family_folder
    ours = Tokenizer.from_hf_folder(folder)
    before, after = ours.special_affixes
    words = ["Héllo", "WORLD", "café", "東京", "dog."]
    enc = ours.encode_words(words)
    assert enc.ids == ours.encode(" ".join(words)) and enc.n_empty == 0
    assert enc.word_spans[0][0] == len(before) and enc.word_spans[-1][1] == len(enc.ids) - len(after)
    assert enc.ids[len(enc.ids) - len(after):] == after
    back = Tokenizer.load(ours.save(tmp_path / "tok"))
    assert back.affixes == ours.affixes and back.special_affixes == (before, after)
    assert back.fingerprint() == ours.fingerprint() and all(back.encode(t) == ours.encode(t) for t in HARD)
    meta = json.loads((tmp_path / "tok" / "tokenizer_meta.json").read_text())
    assert ("affixes" in meta) == (family != "xlm-roberta")  # XLM-R's <s> ... </s> follows from its roles


def test_t5_sentinels_the_file_lacks_are_added_as_transformers_adds_them(tmp_path):
    """A T5 tokenizer.json without its <extra_id_i> added tokens: T5Tokenizer adds extra_ids of them
    (new ids, in order), and so do we."""
    folder = sentencepiece_folder(tmp_path / "t5", "t5")
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if not t["content"].startswith("<extra_id_")]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg = {k: v for k, v in cfg.items() if k not in ("extra_special_tokens", "additional_special_tokens",
                                                     "added_tokens_decoder")}
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "extra_ids": 2}))
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    ours = Tokenizer.from_hf_folder(folder)
    assert ours.vocab_size == len(ref) and ours.token_to_id("<extra_id_1>") == ref.convert_tokens_to_ids("<extra_id_1>")
    for text in HARD:
        assert ours.encode(text) == ref(text)["input_ids"], text


# ---------------------------------------------------------------- the importers read them
def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


@pytest.mark.parametrize("family", ["t5", "xlnet"])
def test_t5_and_xlnet_folders_import_with_their_tokenizer(tmp_path, family):
    folder = tmp_path / "hf"
    (hf_t5() if family == "t5" else hf_xlnet()).save_pretrained(folder)
    sentencepiece_folder(folder, family)
    model, tok = quiet(import_hf, folder, tmp_path / "ckpt")
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert tok is not None and tok.kind == "unigram"
    assert [tok.encode(t) for t in HARD] == [ref(t)["input_ids"] for t in HARD]
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["notes"] == [] and report["tokenizer"].startswith(f"tokenizer.json: unigram, {len(ref)} ids")
    _, saved = load(tmp_path / "ckpt")
    assert saved.special_affixes == tok.special_affixes and saved.encode(HARD[0]) == tok.encode(HARD[0])


def test_xlm_roberta_folder_matches_transformers(tmp_path):
    torch.manual_seed(0)
    folder = tmp_path / "hf"
    cfg = transformers.XLMRobertaConfig(**roberta_config().to_dict())
    model = transformers.XLMRobertaForMaskedLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias") or "position_embeddings" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    sentencepiece_folder(folder, "xlm-roberta")
    with pytest.warns(UserWarning, match="pooler"):  # XLMRobertaForMaskedLM has no pooler
        ours, tok = import_hf(folder, tmp_path / "ckpt")
    assert (ours.config.position_ids, ours.config.pad_token_id) == ("roberta", 1)
    mask = (ROBERTA_IDS != 1).long()
    ref = transformers.XLMRobertaForMaskedLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    with torch.no_grad():
        r = ref(ROBERTA_IDS, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        o = ours(ROBERTA_IDS, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        logits = ours.mlm_logits(o.last_hidden_state)
    keep = mask.bool()
    for a, b in zip(o.hidden_states, r.hidden_states, strict=True):
        assert_close(a[keep], b[keep], atol=1e-5, rtol=0)
    for a, b in zip(o.attentions, r.attentions, strict=True):
        assert_close(a.transpose(1, 2)[keep], b.transpose(1, 2)[keep], atol=1e-5, rtol=0)
    assert_close(logits[keep], r.logits[keep], atol=1e-5, rtol=0)
    print("xlm-roberta max |diff|:", {"hidden": max(float((a - b)[keep].abs().max()) for a, b in zip(o.hidden_states, r.hidden_states)),
                                      "logits": float((logits - r.logits)[keep].abs().max())})
    ref_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert tok is not None and [tok.encode(t) for t in HARD] == [ref_tok(t)["input_ids"] for t in HARD]
    assert tok.pad_id == ours.config.pad_token_id
    report = json.loads((tmp_path / "ckpt" / "card.json").read_text())["import"]
    assert report["family"] == "xlm-roberta" and report["mlm_head"] == "imported" and report["unknown_tensors"] == []
    assert report["tokenizer"].startswith("tokenizer.json: unigram") and report["tokenizer"].endswith("<s> ... </s>")


def test_adding_sentinels_keeps_the_family_affixes(tmp_path):
    """with_sentinels copies the tokenizer to add <extra_id_i>: the copy keeps XLNet's rule of
    appending <sep> <cls> (affixes), so a denoising run over an XLNet tokenizer encodes as it does."""
    from plmodels.training.data import with_sentinels

    tok = Tokenizer.from_hf_folder(sentencepiece_folder(tmp_path / "xlnet", "xlnet"))
    copy = with_sentinels(tok, 2)
    assert copy.affixes == tok.affixes == ((), ("sep", "cls"))
    ids = copy.encode("the dog sat")
    assert ids[-2:] == [copy.token_to_id("<sep>"), copy.token_to_id("<cls>")] and ids == tok.encode("the dog sat")
