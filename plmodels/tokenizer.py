"""Subword tokenizers for the encoders (WordPiece, SentencePiece Unigram) and decoders (byte-level BPE).

`Tokenizer` wraps a `tokenizers.Tokenizer` (the Rust HF tokenizers library) and adds what the
workbench needs on top: word-aligned encoding with exact word spans (edge probing reads word
vectors by pooling subwords, Tenney et al. 2019), stable special-token ids, a JSON-only save
format and a fingerprint.

Three kinds (docs/design.md "Tokenizer"):
- "wordpiece" (BERT, Devlin et al. 2019; WordPiece of Wu et al. 2016): BERT normalizer and
  pre-tokenizer, "##" continuing prefix, specials [PAD] [UNK] [CLS] [SEP] [MASK]. A trained
  tokenizer has them at ids 0..4 in that order; one built from a BERT vocab.txt keeps the file's ids.
  `add_special=True` wraps a sequence as [CLS] ... [SEP].
- "bpe" (byte-level BPE as in GPT-2, Radford et al. 2019): one special, <|endoftext|>, serving as
  BOS, EOS, PAD and (since byte-level BPE has no unknown token) as the filler for an empty word.
  `add_special=True` *prepends* <|endoftext|> as BOS, so the first word has a left context token;
  nothing is appended.
- "unigram" (SentencePiece's Unigram LM, Kudo 2018; ALBERT, T5, XLNet, XLM-R): imported only
  (`from_hf_folder`), a Metaspace ("▁") pre-tokenizer, the family's specials; `add_special=True` adds
  what the family's transformers class adds (ALBERT [CLS] ... [SEP], XLM-R <s> ... </s>, T5 ... </s>,
  XLNet ... <sep> <cls>).

What `add_special=True` adds follows the special-token roles, not the kind: a tokenizer with both
a `cls` and a `sep` role wraps as cls ... sep (BERT's [CLS] ... [SEP], RoBERTa's <s> ... </s>);
otherwise one with a `bos` role prepends it (GPT-2's <|endoftext|>); `special_affixes` gives both.
A family whose rule is another (T5, XLNet) names its roles in `affixes`, saved in tokenizer_meta.json.

Imported byte-level BPE tokenizers (`from_hf_folder`: GPT-2, RoBERTa) are read from the
checkpoint's own files, never from a hub: tokenizer.json when present, else vocab.json + merges.txt
built exactly as transformers builds them; the roles come from tokenizer_config.json /
special_tokens_map.json over the family's defaults. Their ids equal transformers' fast tokenizer
built from the same files: GPT-2 (GPT2TokenizerFast: <|endoftext|> is bos, eos and unk, no pad;
`add_special=False` gives its ids, `add_special=True` its ids with add_bos_token=True) and RoBERTa
(RobertaTokenizerFast: `add_special=True` gives its <s> X </s>).

Imported Unigram tokenizers (`from_hf_folder`: ALBERT, T5, XLNet, XLM-R; SentencePiece, Kudo &
Richardson 2018) come from tokenizer.json. transformers 5's classes do not use that file's normalizer
and pre-tokenizer: each rebuilds its own over the file's vocabulary, Precompiled charsmap and added
tokens, with a fixed <unk> id (one `UnigramFamily` record each in UNIGRAM_FAMILIES):
- AlbertTokenizer: <unk> 1; from tokenizer_config.json's do_lower_case, keep_accents, add_prefix_space;
- T5Tokenizer: <unk> 2; the charsmap only; "▁" always prepended; add_special appends </s>; the
  <extra_id_i> sentinels (extra_ids, default 100) are special tokens;
- XLNetTokenizer: <unk> at tokenizer_config.json's unk_id (0); `` and '' -> ", NFKD, accents stripped
  (always), lowercased with do_lower_case; add_special appends <sep> <cls>; <eop> <eod> are specials;
- XLMRobertaTokenizer: <unk> 3; the charsmap only; add_special wraps <s> ... </s>.
A folder of these families is read the same way, so the ids equal transformers'; another Unigram
folder is read as its tokenizer.json says.

Specials are added here in Python, not by the wrapped tokenizer's post-processor, so the same rule
holds for trained and imported tokenizers. (Trained tokenizers still carry a matching
post-processor so their tokenizer.json behaves the same way when used on its own.)

Reproducibility: byte-level BPE training is deterministic, and so is WordPiece training here. The
library's WordPiece trainer numbers the continuation alphabet ("##a", ...) in the order it meets them
in a hash map of the words and breaks ties between equally frequent merges by those numbers, so two
trainings on the same text gave different vocabularies. `train_wordpiece` gives the trainer that
alphabet in sorted order among its specials (so nothing is left to number in hash order) and then
rebuilds the tokenizer from the trained vocabulary with only the real specials: the same text gives
the same vocabulary, ids included, every time (the stock trainer's hash maps draw a new seed each, in one
process too: tested by training four times).
"""
from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Literal

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HFTokenizer

from plmodels.files import write_text_atomic

Kind = Literal["wordpiece", "bpe", "unigram"]
KINDS = ("wordpiece", "bpe", "unigram")

WORDPIECE_SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
ENDOFTEXT = "<|endoftext|>"
BPE_SPECIALS = {"bos": ENDOFTEXT, "eos": ENDOFTEXT, "pad": ENDOFTEXT, "unk": ENDOFTEXT}
# The defaults of transformers' GPT2Tokenizer and RobertaTokenizer (a checkpoint's
# tokenizer_config.json / special_tokens_map.json override them); GPT-2 has no padding token.
GPT2_SPECIALS = {"bos": ENDOFTEXT, "eos": ENDOFTEXT, "unk": ENDOFTEXT}
ROBERTA_SPECIALS = {"bos": "<s>", "eos": "</s>", "unk": "<unk>", "sep": "</s>", "pad": "<pad>", "cls": "<s>",
                    "mask": "<mask>"}
# transformers' GPTNeoXTokenizer (Pythia): GPT-2's roles and a padding token of its own
GPT_NEOX_SPECIALS = {**GPT2_SPECIALS, "pad": "<|padding|>"}
# transformers' AlbertTokenizer defaults ([CLS] / [SEP] also serve as bos / eos)
ALBERT_SPECIALS = {"bos": "[CLS]", "eos": "[SEP]", "unk": "<unk>", "sep": "[SEP]", "pad": "<pad>", "cls": "[CLS]",
                   "mask": "[MASK]"}
METASPACE = "\u2581"  # SentencePiece's word-start mark "▁"
# transformers' T5Tokenizer, XLNetTokenizer and XLMRobertaTokenizer defaults (SentencePiece Unigram)
T5_SPECIALS = {"eos": "</s>", "unk": "<unk>", "pad": "<pad>"}
XLNET_SPECIALS = {"bos": "<s>", "eos": "</s>", "unk": "<unk>", "sep": "<sep>", "pad": "<pad>", "cls": "<cls>",
                  "mask": "<mask>"}
XLM_ROBERTA_SPECIALS = dict(ROBERTA_SPECIALS)  # <s> <pad> </s> <unk> ... <mask>, as RoBERTa's
HF_FAMILIES = {"GPT2Tokenizer": GPT2_SPECIALS, "RobertaTokenizer": ROBERTA_SPECIALS, "GPTNeoXTokenizer": GPT_NEOX_SPECIALS,
               "AlbertTokenizer": ALBERT_SPECIALS, "T5Tokenizer": T5_SPECIALS, "XLNetTokenizer": XLNET_SPECIALS,
               "XLMRobertaTokenizer": XLM_ROBERTA_SPECIALS}  # tokenizer_class, "Fast" dropped
HF_MODEL_TYPES = {"gpt2": GPT2_SPECIALS, "roberta": ROBERTA_SPECIALS, "gpt_neox": GPT_NEOX_SPECIALS,
                  "albert": ALBERT_SPECIALS, "t5": T5_SPECIALS, "xlnet": XLNET_SPECIALS,
                  "xlm-roberta": XLM_ROBERTA_SPECIALS}  # config.json model_type
MODEL_TYPE_CLASSES = {"gpt2": "GPT2Tokenizer", "roberta": "RobertaTokenizer", "gpt_neox": "GPTNeoXTokenizer",
                      "albert": "AlbertTokenizer", "t5": "T5Tokenizer", "xlnet": "XLNetTokenizer",
                      "xlm-roberta": "XLMRobertaTokenizer"}  # the tokenizer class a model_type implies
HF_ROLE_ORDER = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")  # the order transformers adds them in
# Every role a tokenizer may have; absent roles give None.
ROLES = ("pad", "unk", "cls", "sep", "mask", "bos", "eos")

TOKENIZER_FILE = "tokenizer.json"
META_FILE = "tokenizer_meta.json"
META_VERSION = 1


@dataclass(frozen=True)
class WordEncoding:
    """Subword ids of a pre-split sentence and the subwords each word covers.

    ids: (T,) token ids, specials included (see `Tokenizer.special_affixes`: [CLS] .. [SEP] for
        WordPiece, BOS at 0 for GPT-2-style BPE, <s> .. </s> for RoBERTa).
    word_spans: one (start, end) per word, end exclusive, indices into `ids`; spans are
        non-empty, contiguous and in word order.
    n_empty: words that produced no subword and were given the unknown id instead.
    """

    ids: list[int]
    word_spans: list[tuple[int, int]]
    n_empty: int = 0


def _read_json_object(path: Path) -> dict:
    """A JSON object from `path`, {} if the file does not exist."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_content(value, where: str) -> str | None:
    """A special token as transformers writes it: a string, {"content": ...} or null (no token)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"{where}: expected a token string, {{'content': ...}} or null, got {value!r}")


def _added_token(value, where: str) -> AddedToken:
    """A special AddedToken from a string or transformers' serialised form (its lstrip/rstrip/... kept)."""
    content = _token_content(value, where)
    if content is None:
        raise ValueError(f"{where}: a token is needed, got null")
    flags = {k: bool(value[k]) for k in ("single_word", "lstrip", "rstrip", "normalized", "special")
             if isinstance(value, dict) and k in value}
    return AddedToken(content, **{"special": True, "normalized": False, **flags})


def _lowercases(spec: dict) -> bool:
    """Whether a tokenizer.json's normalizer lowercases (BertNormalizer's flag, or a Lowercase step)."""
    norm = spec.get("normalizer") or {}
    steps = norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]
    return any(isinstance(n, dict) and (n.get("type") == "Lowercase" or n.get("type") == "BertNormalizer"
                                        and n.get("lowercase", False)) for n in steps)


def _bert_normalizer(lowercase: bool) -> normalizers.Normalizer:
    # strip_accents=None follows `lowercase`, exactly as BERT's do_lower_case does.
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )


def _wordpiece_post_processor(cls_id: int, sep_id: int) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )


def _bert_wordpiece(vocab: dict[str, int] | None, lowercase: bool) -> HFTokenizer:
    """BERT's WordPiece pipeline (normalizer, pre-tokenizer, "##" model and decoder), no specials added."""
    model = (models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##") if vocab is not None
             else models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    hf = HFTokenizer(model)
    hf.normalizer = _bert_normalizer(lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    return hf


def _continuation_chars(hf: HFTokenizer, texts: Iterable[str]) -> set[str]:
    """The characters the WordPiece trainer would give a "##" form: every character after the first of a
    word, the words being `hf`'s normalizer and pre-tokenizer applied to each text (as the trainer does).
    BERT's normalizer maps every whitespace character to " ", so the pre-tokenizer runs once per distinct
    space-separated piece rather than once per word."""
    pieces: set[str] = set()
    for text in texts:
        pieces.update(hf.normalizer.normalize_str(text).split(" "))
    chars: set[str] = set()
    for piece in pieces:
        for word, _ in hf.pre_tokenizer.pre_tokenize_str(piece):
            chars.update(word[1:])
    return chars


def _byte_level_bpe_from_files(folder: Path, tok_cfg: dict) -> HFTokenizer:
    """vocab.json + merges.txt -> the byte-level BPE transformers' GPT2Tokenizer / RobertaTokenizer build."""
    vocab, merges = models.BPE.read_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
    hf = HFTokenizer(models.BPE(vocab, merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
                                fuse_unk=False))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=bool(tok_cfg.get("add_prefix_space", False)))
    hf.decoder = decoders.ByteLevel()
    where = str(folder / "tokenizer_config.json")
    declared = tok_cfg.get("added_tokens_decoder") or {}
    if not isinstance(declared, dict):
        raise ValueError(f"{where}: added_tokens_decoder must be an object of id -> token")
    for key, value in sorted(declared.items(), key=lambda kv: int(kv[0])):
        token = _added_token(value, f"{where}: added_tokens_decoder[{key}]")
        if token.special:
            hf.add_special_tokens([token])
        else:
            hf.add_tokens([token])
        if hf.token_to_id(token.content) != int(key):
            raise ValueError(f"{where}: added token {token.content!r} is declared at id {key}, "
                             f"but the vocabulary gives it id {hf.token_to_id(token.content)}")
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra = tok_cfg.get(key) or []
        if isinstance(extra, list):
            hf.add_special_tokens([_added_token(v, f"{where}: {key}") for v in extra])
    return hf


def albert_pipeline(do_lower_case: bool = True, keep_accents: bool = False, add_prefix_space: bool = True,
                    precompiled_charsmap: str | None = None):
    """(normalizer, pre-tokenizer, decoder) as transformers 5's AlbertTokenizer builds them from its
    flags (`precompiled_charsmap`: base64, as tokenizer.json stores SentencePiece's)."""
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if not keep_accents:
        steps += [normalizers.NFKD(), normalizers.StripAccents()]
    if do_lower_case:
        steps.append(normalizers.Lowercase())
    if precompiled_charsmap is not None:
        steps.append(normalizers.Precompiled(base64.b64decode(precompiled_charsmap)))
    scheme = "always" if add_prefix_space else "never"
    pre = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                   pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme=scheme)])
    return normalizers.Sequence(steps), pre, decoders.Metaspace(replacement=METASPACE, prepend_scheme=scheme)


def _precompiled_charsmap(spec: dict) -> str | None:
    """The Precompiled normalizer's charsmap (base64) in a tokenizer.json spec, else None."""
    norm = spec.get("normalizer") or {}
    steps = norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]
    for step in steps:
        if isinstance(step, dict) and step.get("type") == "Precompiled" and step.get("precompiled_charsmap"):
            return step["precompiled_charsmap"]
    return None


def _metaspace(scheme: str, split: bool = True):
    """(pre-tokenizer, decoder) of SentencePiece's word-start mark: whitespace split, then "▁" marks."""
    pre = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                   pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme=scheme, split=split)])
    return pre, decoders.Metaspace(replacement=METASPACE, prepend_scheme=scheme, split=split)


def _charsmap_only(charsmap: str | None):
    """The file's Precompiled charsmap as the only normalizer (T5, XLM-R), or none."""
    return None if charsmap is None else normalizers.Precompiled(base64.b64decode(charsmap))


def _albert_like(tok_cfg: dict, charsmap: str | None):
    return albert_pipeline(do_lower_case=bool(tok_cfg.get("do_lower_case", True)),
                           keep_accents=bool(tok_cfg.get("keep_accents", False)),
                           add_prefix_space=bool(tok_cfg.get("add_prefix_space", True)), precompiled_charsmap=charsmap)


def _t5_like(tok_cfg: dict, charsmap: str | None):
    return (_charsmap_only(charsmap), *_metaspace("always"))


def _xlnet_like(tok_cfg: dict, charsmap: str | None):
    # XLNetTokenizer strips accents whatever keep_accents says (transformers 5 comments that test out)
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"'), normalizers.NFKD(), normalizers.StripAccents()]
    if tok_cfg.get("do_lower_case", False):
        steps.append(normalizers.Lowercase())
    if charsmap is not None:
        steps.append(normalizers.Precompiled(base64.b64decode(charsmap)))
    return (normalizers.Sequence(steps), *_metaspace("always"))


def _xlm_roberta_like(tok_cfg: dict, charsmap: str | None):
    return (_charsmap_only(charsmap), *_metaspace("always" if tok_cfg.get("add_prefix_space", True) else "never"))


@dataclass(frozen=True)
class UnigramFamily:
    """How transformers 5's tokenizer class of one SentencePiece (Unigram) family rebuilds a folder's
    tokenizer.json: it keeps the file's vocabulary, Precompiled charsmap and added tokens, and puts its
    own normalizer, pre-tokenizer, <unk> id and special tokens over them, whatever else the file says.
    `Tokenizer.from_hf_folder` rebuilds a folder of a known family the same way, so ids equal the class'."""

    specials: dict[str, str]  # role -> the class' default token (tokenizer_config.json overrides)
    unk_id: Callable[[dict], int]  # tokenizer_config.json -> the id the class gives <unk>
    pipeline: Callable[[dict, str | None], tuple]  # (tokenizer_config.json, charsmap) -> (normalizer | None, pre, decoder)
    lowercase: Callable[[dict], bool]  # whether the pipeline lowercases
    affixes: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # roles add_special puts before / after; None: from the roles
    extras: Callable[[dict], list[str]] = lambda cfg: []  # special tokens the class adds when the file lacks them


def _listed_extras(tok_cfg: dict) -> list[str] | None:
    for key in ("additional_special_tokens", "extra_special_tokens"):
        listed = tok_cfg.get(key)
        if isinstance(listed, list) and listed:
            return [str(_token_content(t, f"tokenizer_config.json: {key}")) for t in listed]
    return None


UNIGRAM_FAMILIES: dict[str, UnigramFamily] = {
    "AlbertTokenizer": UnigramFamily(ALBERT_SPECIALS, lambda cfg: 1, _albert_like,
                                     lambda cfg: bool(cfg.get("do_lower_case", True))),
    # T5: <pad>=0 </s>=1 <unk>=2; add_special appends </s> (T5Tokenizer's "$A </s>"); sentinels <extra_id_i>
    "T5Tokenizer": UnigramFamily(T5_SPECIALS, lambda cfg: 2, _t5_like, lambda cfg: False, affixes=((), ("eos",)),
                                 extras=lambda cfg: _listed_extras(cfg) or [f"<extra_id_{i}>"
                                                                            for i in range(int(cfg.get("extra_ids", 100)))]),
    # XLNet: add_special appends <sep> <cls> (XLNetTokenizer's "$A <sep> <cls>"); <eop> <eod> are specials too
    "XLNetTokenizer": UnigramFamily(XLNET_SPECIALS, lambda cfg: int(cfg.get("unk_id", 0)), _xlnet_like,
                                    lambda cfg: bool(cfg.get("do_lower_case", False)), affixes=((), ("sep", "cls")),
                                    extras=lambda cfg: _listed_extras(cfg) or ["<eop>", "<eod>"]),
    # XLM-R: <s>=0 <pad>=1 </s>=2 <unk>=3; add_special wraps <s> ... </s> (its cls and sep roles)
    "XLMRobertaTokenizer": UnigramFamily(XLM_ROBERTA_SPECIALS, lambda cfg: 3, _xlm_roberta_like, lambda cfg: False),
}


def _tokenizer_class(folder: Path, tok_cfg: dict) -> str:
    """tokenizer_config.json's tokenizer_class ("Fast" dropped), else the one config.json's model_type implies."""
    family = str(tok_cfg.get("tokenizer_class") or "").removesuffix("Fast")
    if family:
        return family
    return MODEL_TYPE_CLASSES.get(_read_json_object(folder / "config.json").get("model_type"), "")


def _rebuilt_unigram(path: Path, hf: HFTokenizer, spec: dict, tok_cfg: dict, family: UnigramFamily) -> HFTokenizer:
    """The tokenizer a transformers 5 Unigram class (`family`) builds from a folder: the tokenizer.json's
    vocabulary as Unigram(the class' unk_id, no byte fallback), its post-processor and added tokens,
    and the class' normalizer / pre-tokenizer / decoder over the file's Precompiled charsmap."""
    model = spec.get("model", {})
    vocab = [(str(t), float(score)) for t, score in model.get("vocab") or []]
    unk_id = family.unk_id(tok_cfg)
    if len(vocab) <= unk_id:
        raise ValueError(f"{path}: a Unigram vocabulary of {len(vocab)} entries has no <unk> at id {unk_id}")
    if model.get("unk_id", unk_id) != unk_id:
        raise ValueError(f"{path}: model.unk_id={model.get('unk_id')!r}, but transformers' tokenizer class of this "
                         f"folder puts <unk> at id {unk_id} whatever the file says; not read rather than giving other ids")
    if model.get("byte_fallback", False):
        raise ValueError(f"{path}: model.byte_fallback=true, which transformers' tokenizer class of this folder switches off")
    out = HFTokenizer(models.Unigram(vocab, unk_id=unk_id, byte_fallback=False))
    normalizer, out.pre_tokenizer, out.decoder = family.pipeline(tok_cfg, _precompiled_charsmap(spec))
    if normalizer is not None:
        out.normalizer = normalizer
    out.post_processor = hf.post_processor
    for token in sorted(hf.get_added_tokens_decoder().items()):
        (out.add_special_tokens if token[1].special else out.add_tokens)([token[1]])
        if out.token_to_id(token[1].content) != token[0]:
            raise ValueError(f"{path}: added token {token[1].content!r} has id {token[0]} in the file but "
                             f"{out.token_to_id(token[1].content)} over its vocabulary")
    return out


def _hf_roles(folder: Path, tok_cfg: dict, vocab: dict[str, int]) -> dict[str, str]:
    """role -> token of a transformers tokenizer folder (see Tokenizer.from_hf_folder)."""
    family = str(tok_cfg.get("tokenizer_class") or "").removesuffix("Fast")
    model_type = _read_json_object(folder / "config.json").get("model_type")
    if family in HF_FAMILIES:
        roles = dict(HF_FAMILIES[family])
    elif model_type in HF_MODEL_TYPES:
        roles = dict(HF_MODEL_TYPES[model_type])
    elif ENDOFTEXT in vocab:
        roles = dict(GPT2_SPECIALS)
    elif all(t in vocab for t in ROBERTA_SPECIALS.values()):
        roles = dict(ROBERTA_SPECIALS)
    else:
        roles = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):  # the later file wins, as in transformers
        config = tok_cfg if name == "tokenizer_config.json" else _read_json_object(folder / name)
        for role in ROLES:
            if f"{role}_token" in config:
                token = _token_content(config[f"{role}_token"], f"{folder / name}: {role}_token")
                if token is None:
                    roles.pop(role, None)
                else:
                    roles[role] = token
    if not roles:
        raise ValueError(f"{folder}: cannot tell the special tokens: no GPT2Tokenizer / RobertaTokenizer / "
                         f"AlbertTokenizer tokenizer_class, no gpt2 / roberta / albert model_type, neither {ENDOFTEXT} nor RoBERTa's "
                         f"specials in the vocabulary, and no <role>_token in tokenizer_config.json or "
                         f"special_tokens_map.json")
    return roles


class Tokenizer:
    """A WordPiece, byte-level BPE or Unigram tokenizer with word-aligned encoding (see module docstring)."""

    def __init__(self, hf: HFTokenizer, kind: Kind, specials: dict[str, str], lowercase: bool = False,
                 affixes: tuple[tuple[str, ...], tuple[str, ...]] | None = None):
        """affixes: the roles `add_special` puts before and after a sequence when the family's rule is
        not the one the roles imply (T5: ((), ("eos",)); XLNet: ((), ("sep", "cls"))); None: from the roles."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        unknown = set(specials) - set(ROLES)
        if unknown:
            raise ValueError(f"unknown special-token roles {sorted(unknown)}; valid: {list(ROLES)}")
        if affixes is not None:
            affixes = (tuple(affixes[0]), tuple(affixes[1]))
            absent = [r for r in (*affixes[0], *affixes[1]) if r not in specials]
            if absent:
                raise ValueError(f"affixes name roles the tokenizer lacks: {absent}; its roles: {sorted(specials)}")
        missing = [f"{role}={tok}" for role, tok in specials.items() if hf.token_to_id(tok) is None]
        if missing:
            raise ValueError(f"special tokens not in the vocabulary: {', '.join(missing)}")
        self._hf = hf
        self.kind: Kind = kind
        self.specials = dict(specials)
        self.lowercase = bool(lowercase)
        self.affixes = affixes
        self._ids = {role: hf.token_to_id(tok) for role, tok in specials.items()}

    # ----------------------------------------------------------------------------- construction
    @classmethod
    def train_wordpiece(
        cls, texts: Iterable[str], vocab_size: int, lowercase: bool = False, min_frequency: int = 2
    ) -> "Tokenizer":
        """Train a BERT-style WordPiece tokenizer; specials [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4."""
        names = list(WORDPIECE_SPECIALS.values())
        if vocab_size < len(names) + 1:
            raise ValueError(f"vocab_size must exceed the {len(names)} specials, got {vocab_size}")
        texts = texts if isinstance(texts, (list, tuple)) else list(texts)
        hf = _bert_wordpiece(None, lowercase)
        # the continuation alphabet in sorted order, given ahead of training (see the module docstring)
        continuations = [f"##{c}" for c in sorted(_continuation_chars(hf, texts))]
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=names + continuations,
            continuing_subword_prefix="##",
            show_progress=False,
        )
        hf.train_from_iterator(texts, trainer=trainer)
        vocab = hf.get_vocab(with_added_tokens=False)
        return cls._bert_wordpiece_from_vocab(vocab, lowercase)

    @classmethod
    def _bert_wordpiece_from_vocab(cls, vocab: dict[str, int], lowercase: bool) -> "Tokenizer":
        """A BERT WordPiece tokenizer over `vocab` (token -> id), its five specials the only special tokens."""
        hf = _bert_wordpiece(vocab, lowercase)
        hf.add_special_tokens(list(WORDPIECE_SPECIALS.values()))
        hf.post_processor = _wordpiece_post_processor(vocab["[CLS]"], vocab["[SEP]"])
        return cls(hf, "wordpiece", WORDPIECE_SPECIALS, lowercase=lowercase)

    @classmethod
    def train_bpe(cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> "Tokenizer":
        """Train a GPT-2-style byte-level BPE tokenizer; <|endoftext|> = 0 is BOS/EOS/PAD."""
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        if vocab_size < len(alphabet) + 1:
            raise ValueError(f"vocab_size must be at least {len(alphabet) + 1} (256 bytes + 1 special), got {vocab_size}")
        hf = HFTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=[ENDOFTEXT],
            initial_alphabet=alphabet,
            show_progress=False,
        )
        hf.train_from_iterator(texts, trainer=trainer)
        bos = hf.token_to_id(ENDOFTEXT)
        hf.post_processor = processors.TemplateProcessing(
            single=f"{ENDOFTEXT} $A", pair=f"{ENDOFTEXT} $A {ENDOFTEXT} $B:1", special_tokens=[(ENDOFTEXT, bos)]
        )
        return cls(hf, "bpe", BPE_SPECIALS)

    @classmethod
    def from_bert_vocab(cls, vocab_path: str | Path, lowercase: bool) -> "Tokenizer":
        """WordPiece from a BERT `vocab.txt` (one token per line, id = line number).

        Matches BertTokenizerFast(vocab, do_lower_case=lowercase): BERT normalizer (accents stripped
        iff lowercase), BERT pre-tokenizer, greedy longest-match-first WordPiece with "##".
        """
        vocab_path = Path(vocab_path)
        if not vocab_path.is_file():
            raise FileNotFoundError(f"BERT vocab file {vocab_path} does not exist")
        vocab: dict[str, int] = {}
        with open(vocab_path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                token = line.rstrip("\n")
                if token in vocab:
                    raise ValueError(f"{vocab_path}:{i + 1}: duplicate token {token!r}")
                vocab[token] = i
        absent = [t for t in WORDPIECE_SPECIALS.values() if t not in vocab]
        if absent:
            raise ValueError(f"{vocab_path} lacks the special tokens {absent}")
        return cls._bert_wordpiece_from_vocab(vocab, lowercase)

    @classmethod
    def from_hf_tokenizer_json(cls, path: str | Path) -> "Tokenizer":
        """Wrap an existing HF `tokenizer.json` (e.g. from a BERT or GPT-2 checkpoint).

        The kind comes from the model type: WordPiece -> "wordpiece" (needs the five BERT
        specials), BPE -> "bpe": with <|endoftext|> in the vocabulary it takes the workbench's BPE
        roles (BPE_SPECIALS: <|endoftext|> also pads), else with <s> </s> <unk> <pad> <mask> RoBERTa's.
        Lowercasing is read from a BertNormalizer. A checkpoint folder, whose tokenizer_config.json
        says which tokens play which role, is read with `from_hf_folder` instead.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        hf = HFTokenizer.from_file(str(path))
        # Checkpoints often ship a tokenizer.json that pads/truncates to a fixed length (MiniLM pads
        # to 128); the workbench adds specials and handles length itself, so both are switched off.
        hf.no_padding()
        hf.no_truncation()
        spec = json.loads(hf.to_str())
        model_type = spec.get("model", {}).get("type")
        if model_type == "WordPiece":
            norm = spec.get("normalizer") or {}
            lowercase = bool(norm.get("lowercase", False)) if norm.get("type") == "BertNormalizer" else False
            return cls(hf, "wordpiece", WORDPIECE_SPECIALS, lowercase=lowercase)
        if model_type == "BPE":
            if "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
                raise ValueError(f"{path}: only byte-level BPE (GPT-2 style) is supported")
            vocab = hf.get_vocab(with_added_tokens=True)
            if ENDOFTEXT in vocab:
                return cls(hf, "bpe", BPE_SPECIALS)
            if all(t in vocab for t in ROBERTA_SPECIALS.values()):
                return cls(hf, "bpe", ROBERTA_SPECIALS)
            raise ValueError(f"{path}: a byte-level BPE without {ENDOFTEXT} nor RoBERTa's specials "
                             f"{sorted(set(ROBERTA_SPECIALS.values()))}; read its folder with Tokenizer.from_hf_folder")
        if model_type == "Unigram":
            vocab = hf.get_vocab(with_added_tokens=True)
            if all(t in vocab for t in ALBERT_SPECIALS.values()):
                return cls(hf, "unigram", ALBERT_SPECIALS, lowercase=_lowercases(spec))
            raise ValueError(f"{path}: a Unigram tokenizer without ALBERT's specials "
                             f"{sorted(set(ALBERT_SPECIALS.values()))}; read its folder with Tokenizer.from_hf_folder")
        raise ValueError(f"{path}: model type {model_type!r} is not supported (WordPiece, BPE or Unigram)")

    @classmethod
    def from_hf_folder(cls, path: str | Path) -> Tokenizer:
        """A byte-level BPE (GPT-2, RoBERTa, GPT-NeoX) or Unigram (ALBERT, T5, XLNet, XLM-R) tokenizer
        from a Hugging Face checkpoint folder's own files.

        Unigram: tokenizer.json only; a folder of a family in UNIGRAM_FAMILIES (tokenizer_class
        AlbertTokenizer / T5Tokenizer / XLNetTokenizer / XLMRobertaTokenizer, else the class its
        config.json's model_type implies) is rebuilt as that transformers class rebuilds it
        (`_rebuilt_unigram`, module docstring), with its affixes and the extra special tokens it adds
        (T5's sentinels, XLNet's <eop> <eod>); another is taken as the file says.

        Files: tokenizer.json when present (its padding/truncation switched off), else vocab.json +
        merges.txt, built as transformers' GPT2Tokenizer / RobertaTokenizer build them (no unk, no
        continuing prefix, ByteLevel pre-tokenizer with tokenizer_config.json's add_prefix_space,
        default false), with tokenizer_config.json's added_tokens_decoder / additional_special_tokens
        added at their ids. Nothing is fetched from a hub.

        Roles: the family's defaults (GPT2_SPECIALS / ROBERTA_SPECIALS), the family read from
        tokenizer_config.json's tokenizer_class, else config.json's model_type, else from the
        vocabulary (<|endoftext|> -> GPT-2; <s> </s> <unk> <pad> <mask> -> RoBERTa); then each
        `<role>_token` of tokenizer_config.json and, over it, special_tokens_map.json (null removes
        the role). A role token absent from the vocabulary is added as a special token (new id), as
        transformers does.
        """
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"tokenizer folder {folder} does not exist")
        tok_cfg = _read_json_object(folder / "tokenizer_config.json")
        built = False
        if (folder / TOKENIZER_FILE).is_file():
            hf = HFTokenizer.from_file(str(folder / TOKENIZER_FILE))
            hf.no_padding()
            hf.no_truncation()
            spec = json.loads(hf.to_str())
            model_type = spec.get("model", {}).get("type")
            if model_type == "Unigram":
                return cls._unigram_folder(folder, hf, spec, tok_cfg)
            if model_type != "BPE" or "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
                raise ValueError(f"{folder / TOKENIZER_FILE}: model {model_type!r} is not a byte-level BPE (GPT-2 / "
                                 f"RoBERTa) nor a Unigram (ALBERT); a BERT folder is read by "
                                 f"plmodels.hf.common.read_tokenizer")
        elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            hf = _byte_level_bpe_from_files(folder, tok_cfg)
            built = True
        else:
            raise FileNotFoundError(f"{folder} has neither {TOKENIZER_FILE} nor vocab.json + merges.txt")
        specials = _hf_roles(folder, tok_cfg, hf.get_vocab(with_added_tokens=True))
        present = {t.content for t in hf.get_added_tokens_decoder().values()}
        missing = [specials[r] for r in HF_ROLE_ORDER if r in specials and specials[r] not in present]
        if missing:  # marked special (kept whole in running text); new ids only for tokens not in the vocabulary
            hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(missing)])
        if built:  # what transformers' classes put on top (our encode adds specials itself)
            if "cls" in specials and "sep" in specials:
                hf.post_processor = processors.RobertaProcessing(
                    (specials["sep"], hf.token_to_id(specials["sep"])),
                    (specials["cls"], hf.token_to_id(specials["cls"])),
                    trim_offsets=bool(tok_cfg.get("trim_offsets", True)),
                    add_prefix_space=bool(tok_cfg.get("add_prefix_space", False)))
            else:
                hf.post_processor = processors.ByteLevel(trim_offsets=False)
        return cls(hf, "bpe", specials)

    @classmethod
    def _unigram_folder(cls, folder: Path, hf: HFTokenizer, spec: dict, tok_cfg: dict) -> Tokenizer:
        """from_hf_folder for a Unigram tokenizer.json (see there)."""
        family = UNIGRAM_FAMILIES.get(_tokenizer_class(folder, tok_cfg))
        if family is not None:
            hf = _rebuilt_unigram(folder / TOKENIZER_FILE, hf, spec, tok_cfg, family)
            lowercase = family.lowercase(tok_cfg)
        else:
            lowercase = _lowercases(spec)
        vocab = hf.get_vocab(with_added_tokens=True)
        specials = _hf_roles(folder, tok_cfg, vocab)
        absent = sorted({t for t in specials.values() if t not in vocab})
        if absent and family is None:
            raise ValueError(f"{folder / TOKENIZER_FILE}: a Unigram tokenizer whose special tokens {absent} are not in "
                             f"its vocabulary, in a folder of no known family ({', '.join(UNIGRAM_FAMILIES)}); not read "
                             "rather than adding them")
        present = {t.content for t in hf.get_added_tokens_decoder().values()}
        missing = [specials[r] for r in HF_ROLE_ORDER if r in specials and specials[r] not in present]
        missing += [t for t in (family.extras(tok_cfg) if family else []) if t not in present and t not in missing]
        if missing:  # kept whole in running text, as transformers registers its special tokens (roles, then extras)
            hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(missing)])
        affixes = None if family is None or family.affixes is None else family.affixes
        return cls(hf, "unigram", specials, lowercase=lowercase, affixes=affixes)

    # ------------------------------------------------------------------------------- ids
    def _role(self, role: str) -> int | None:
        return self._ids.get(role)

    @property
    def pad_id(self) -> int | None:
        return self._role("pad")

    @property
    def unk_id(self) -> int | None:
        return self._role("unk")

    @property
    def cls_id(self) -> int | None:
        return self._role("cls")

    @property
    def sep_id(self) -> int | None:
        return self._role("sep")

    @property
    def mask_id(self) -> int | None:
        return self._role("mask")

    @property
    def bos_id(self) -> int | None:
        return self._role("bos")

    @property
    def eos_id(self) -> int | None:
        return self._role("eos")

    @property
    def doc_sep_id(self) -> int:
        """The id that separates documents in a packed corpus: [SEP] or <|endoftext|>."""
        return self.eos_id if self.kind == "bpe" else self.sep_id  # type: ignore[return-value]

    @property
    def special_affixes(self) -> tuple[list[int], list[int]]:
        """(ids before, ids after) a sequence that `add_special=True` adds: the `affixes` roles when set
        (T5: [], [</s>]; XLNet: [], [<sep>, <cls>]); else [cls], [sep] when the tokenizer has both roles
        (BERT, RoBERTa, ALBERT, XLM-R), else [bos], [] (GPT-2 style), else [], []."""
        if self.affixes is not None:
            return [self._ids[r] for r in self.affixes[0]], [self._ids[r] for r in self.affixes[1]]
        if self.cls_id is not None and self.sep_id is not None:
            return [self.cls_id], [self.sep_id]
        if self.bos_id is not None:
            return [self.bos_id], []
        return [], []

    @property
    def special_ids(self) -> set[int]:
        return set(self._ids.values())

    @property
    def vocab_size(self) -> int:
        """Embedding rows a model needs: every id this tokenizer can emit (added tokens included)."""
        return self._hf.get_vocab_size(with_added_tokens=True)

    @property
    def hf(self) -> HFTokenizer:
        """The wrapped `tokenizers.Tokenizer` (for read-only use)."""
        return self._hf

    def id_to_token(self, i: int) -> str | None:
        return self._hf.id_to_token(int(i))

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """Token strings of `ids` (byte-level BPE shows a leading space as 'Ġ')."""
        return [self._hf.id_to_token(int(i)) for i in ids]

    # ---------------------------------------------------------------------------- encoding
    def _wrap(self, ids: list[int]) -> list[int]:
        before, after = self.special_affixes
        return [*before, *ids, *after]

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of running text; with `add_special`, [CLS] .. [SEP], <s> .. </s> or BOS .. (see module doc)."""
        ids = self._hf.encode(text, add_special_tokens=False).ids
        return self._wrap(ids) if add_special else ids

    def encode_batch(self, texts: list[str], add_special: bool = True) -> list[list[int]]:
        """`encode` over many texts at once (multi-threaded in the Rust library)."""
        # encode_batch_fast (tokenizers >= 0.20) skips the offsets we do not use: ~1.6x faster.
        fast = getattr(self._hf, "encode_batch_fast", self._hf.encode_batch)
        encs = fast(list(texts), add_special_tokens=False)
        return [self._wrap(e.ids) if add_special else e.ids for e in encs]

    def _word_inputs(self, words: list[str]) -> list[str]:
        if self.kind == "bpe":
            # Byte-level BPE marks a word start with a leading space, as in running text.
            return [w if i == 0 else " " + w for i, w in enumerate(words)]
        return list(words)

    def _align(self, words: list[str], enc, add_special: bool) -> WordEncoding:
        """Group subwords by word id; a word with no subword gets the unknown id (else EOS)."""
        unk = self.unk_id if self.unk_id is not None else self.eos_id
        if unk is None and any(not w for w in words):
            raise ValueError("an empty word needs a filler id, and this tokenizer has neither an unk nor an eos role")
        sub_ids, word_ids = enc.ids, enc.word_ids
        before, after = self.special_affixes if add_special else ([], [])
        ids: list[int] = list(before)
        spans: list[tuple[int, int]] = []
        n_empty = 0
        j, n_sub = 0, len(sub_ids)
        for w in range(len(words)):
            start = len(ids)
            while j < n_sub and word_ids[j] == w:
                ids.append(sub_ids[j])
                j += 1
            if len(ids) == start:
                ids.append(unk)
                n_empty += 1
            spans.append((start, len(ids)))
        if j != n_sub:  # the Rust side broke word order: never silently misalign
            raise RuntimeError(f"subword/word alignment failed at subword {j} of {n_sub}")
        ids.extend(after)
        return WordEncoding(ids=ids, word_spans=spans, n_empty=n_empty)

    def encode_words(self, words: list[str], add_special: bool = True) -> WordEncoding:
        """Encode a pre-split sentence so that word i owns subwords `ids[start:end]`.

        Uses pre-tokenized input (`is_pretokenized=True`), so word boundaries are exact.
        """
        return self.encode_words_batch([words], add_special=add_special)[0]

    def encode_words_batch(self, sentences: list[list[str]], add_special: bool = True) -> list[WordEncoding]:
        """`encode_words` for many sentences in one multi-threaded batch call."""
        sentences = [list(ws) for ws in sentences]
        for s, ws in enumerate(sentences):
            bad = [i for i, w in enumerate(ws) if not isinstance(w, str)]
            if bad:
                raise ValueError(f"sentence {s}: word {bad[0]} is {type(ws[bad[0]]).__name__}, not str")
        nonempty = [i for i, ws in enumerate(sentences) if ws]
        encs = self._hf.encode_batch(
            [self._word_inputs(sentences[i]) for i in nonempty], is_pretokenized=True, add_special_tokens=False
        )
        out: list[WordEncoding] = [
            WordEncoding(ids=self._wrap([]) if add_special else [], word_spans=[]) for _ in sentences
        ]
        for i, enc in zip(nonempty, encs):
            out[i] = self._align(sentences[i], enc, add_special)
        return out

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids` (WordPiece joins "##" pieces; byte-level BPE restores bytes and spaces)."""
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    # ------------------------------------------------------------------------------ storage
    def _meta(self) -> dict:
        meta = {"version": META_VERSION, "kind": self.kind, "specials": self.specials, "lowercase": self.lowercase}
        if self.affixes is not None:  # only when set: the meta (and fingerprint) of other tokenizers is unchanged
            meta["affixes"] = {"before": list(self.affixes[0]), "after": list(self.affixes[1])}
        return meta

    def save(self, directory: str | Path) -> Path:
        """Write `tokenizer.json` (HF format) and `tokenizer_meta.json` into `directory`, each atomically
        (`plmodels.files.write_text_atomic`: a failed write leaves the old file)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_text_atomic(directory / TOKENIZER_FILE, self._hf.to_str(pretty=True))
        write_text_atomic(directory / META_FILE, json.dumps(self._meta(), indent=2, sort_keys=True) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "Tokenizer":
        """Read a folder written by `save`."""
        directory = Path(directory)
        for name in (TOKENIZER_FILE, META_FILE):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"tokenizer folder {directory} lacks {name}")
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
        unknown = set(meta) - {"version", "kind", "specials", "lowercase", "affixes"}
        if unknown:
            raise ValueError(f"{directory / META_FILE}: unknown keys {sorted(unknown)}")
        if meta.get("version") != META_VERSION:
            raise ValueError(f"{directory / META_FILE}: version {meta.get('version')!r}, expected {META_VERSION}")
        hf = HFTokenizer.from_file(str(directory / TOKENIZER_FILE))
        affixes = meta.get("affixes")
        if affixes is not None and (not isinstance(affixes, dict) or set(affixes) != {"before", "after"}):
            raise ValueError(f"{directory / META_FILE}: affixes must be {{'before': [roles], 'after': [roles]}}, got {affixes!r}")
        return cls(hf, meta["kind"], meta["specials"], lowercase=meta.get("lowercase", False),
                   affixes=None if affixes is None else (tuple(affixes["before"]), tuple(affixes["after"])))

    def fingerprint(self) -> str:
        """sha256 (hex) of the canonical JSON of the tokenizer and its meta."""
        canon = {"tokenizer": json.loads(self._hf.to_str()), "meta": self._meta()}
        blob = json.dumps(canon, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, lowercase={self.lowercase})"
