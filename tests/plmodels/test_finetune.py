"""Finetuning: full and frozen modes beat chance on planted signals; frozen leaves the base untouched."""
import json
import random

import pytest
import torch
from safetensors.torch import load_file

import plmodels
from plmodels.checkpoint import build_model, training_seed
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from plmodels.training.finetune import FinetuneConfig, TaskData, finetune, load_classifier, load_finetune_config

POS, NEG = ["good", "great", "fine", "lovely"], ["bad", "awful", "poor", "dull"]
FILL = ["the", "film", "was", "a", "story", "and", "plot", "quite", "very", "with", "actors", "its"]


def _sentences(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        y = rng.randint(0, 1)
        words = rng.choices(FILL, k=rng.randint(3, 8))
        words.insert(rng.randint(0, len(words)), rng.choice(POS if y else NEG))
        out.append((" ".join(words), y))
    return out


@pytest.fixture(scope="module", params=["encoder", "decoder"])
def base(request, tmp_path_factory):
    kind = request.param
    texts = [t for t, _ in _sentences(500, 9)]
    tok = Tokenizer.train_wordpiece(texts, 100) if kind == "encoder" else Tokenizer.train_bpe(texts, 300)
    torch.manual_seed(0)
    fields = {**preset(kind, "tiny"), "vocab_size": tok.vocab_size, "dropout": 0.0}
    if kind == "encoder":
        fields["pad_token_id"] = tok.pad_id
    path = tmp_path_factory.mktemp("base") / kind
    plmodels.save(build_model(kind, fields), tok, path, card={"seed": 3})   # as pretrained under seed 3
    return path


def _cfg(base, task, mode, **kw):
    return FinetuneConfig.from_dict({"base": str(base), "task": task, "mode": mode, "batch_size": 16,
                                     "epochs": 4, "eval_every": 20, "patience": 3, "seed": 0,
                                     "lr": 1e-3 if mode == "full" else 1e-2, "num_threads": 1, **kw})


@pytest.mark.parametrize("mode", ["full", "frozen"])
def test_sentence_classification_beats_chance(base, tmp_path, mode):
    data = TaskData("sentence", ["neg", "pos"], _sentences(400, 1), _sentences(100, 2))
    out = finetune(_cfg(base, "sst2", mode), tmp_path / mode, data=data)
    info = json.loads((out / "finetune.json").read_text())
    assert info["mode"] == mode and info["base_hash"] == plmodels.checkpoint_hash(base)
    if mode == "full":
        # A random-init base's pooled [CLS] barely reflects one word, so only full finetuning is held
        # to beating chance here; frozen features are tested on the token task below.
        assert info["dev_metrics"]["accuracy"] > 0.75, info
    clf = load_classifier(out)  # the saved classifier reproduces the dev accuracy
    correct = 0
    for text, y in data.dev:
        ids = torch.tensor([clf.tokenizer.encode(text)])
        correct += int(clf(ids, torch.ones_like(ids)).argmax(-1).item() == y)
    assert correct / len(data.dev) == pytest.approx(info["dev_metrics"]["accuracy"])
    same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a)  # noqa: E731
    wa, wb = (load_file(str(p / "model.safetensors")) for p in (base, out))
    assert same(wa, wb) == (mode == "frozen"), "frozen must leave the base bit-exact; full must change it"
    from plmodels.files import current_umask  # every file saved with the mode open() gives (safetensors: 0600)

    modes = {f.name: f.stat().st_mode & 0o777 for f in out.rglob("*") if f.is_file()}
    assert "head.safetensors" in modes and set(modes.values()) == {0o666 & ~current_umask()}, modes


def test_token_classification_frozen_beats_chance(base, tmp_path):
    tags = {w: 0 for w in FILL} | {w: 1 for w in POS} | {w: 2 for w in NEG}
    sents = lambda n, s: [(t.split(), [tags[w] for w in t.split()]) for t, _ in _sentences(n, s)]  # noqa: E731
    data = TaskData("token", ["FILL", "POS", "NEG"], sents(200, 3), sents(50, 4))
    out = finetune(_cfg(base, "pos", "frozen", epochs=10), tmp_path / "pos", data=data)
    acc = json.loads((out / "finetune.json").read_text())["dev_metrics"]["accuracy"]
    assert acc > 0.9  # majority class (FILL) is ~85%; word identity is linearly readable
    # the finetuned card keeps its base's pretraining seed, so its random-init floor is the base's
    assert training_seed(out) == training_seed(base) == 3


def test_head_lr_trains_the_head_at_its_own_rate(base, tmp_path):
    """Full mode with a near-zero body lr and a large head_lr: the head learns the planted token
    labels while the pretrained weights hardly move (one optimizer, two peak rates)."""
    tags = {w: 0 for w in FILL} | {w: 1 for w in POS} | {w: 2 for w in NEG}
    sents = lambda n, s: [(t.split(), [tags[w] for w in t.split()]) for t, _ in _sentences(n, s)]  # noqa: E731
    data = TaskData("token", ["FILL", "POS", "NEG"], sents(200, 3), sents(50, 4))
    out = finetune(_cfg(base, "pos", "full", epochs=10, lr=1e-9, head_lr=1e-2), tmp_path / "pos", data=data)
    assert json.loads((out / "finetune.json").read_text())["dev_metrics"]["accuracy"] > 0.9
    wa, wb = (load_file(str(p / "model.safetensors")) for p in (base, out))
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-4
    with pytest.raises(ValueError, match="head_lr"):
        FinetuneConfig(base="x", task="pos", head_lr=0.0)


def test_finetune_config_errors(tmp_path):
    with pytest.raises(ValueError, match="bogus"):
        FinetuneConfig.from_dict({"base": "x", "task": "sst2", "bogus": 1})
    with pytest.raises(ValueError, match="task"):
        FinetuneConfig(base="x", task="cola")
    for name in ["sst2-full", "sst2-frozen", "pos-full", "pos-frozen"]:
        assert load_finetune_config(name).task == name.split("-")[0]
