"""Checkpoint save/load: bit-exact round trips (also pruned), tokenizer, card, errors, hash."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.testing import assert_close

from plmodels import checkpoint_hash, load, save
from plmodels.tokenizer import Tokenizer

from .tiny import batch, tiny_decoder, tiny_encoder


@pytest.fixture(scope="module")
def tokenizer():
    texts = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song"] * 5
    return Tokenizer.train_wordpiece(texts, vocab_size=61)


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("build", [tiny_encoder, tiny_decoder])
@pytest.mark.parametrize("pruned", [False, True])
def test_round_trip_is_bit_exact(tmp_path, tokenizer, build, pruned):
    model = build(position="alibi")
    if pruned:
        model.prune_heads({0: [2], 1: [0, 1, 2, 3]})
    path = save(model, tokenizer, tmp_path / "ckpt", card={"steps": 12, "metrics": {"loss": 1.5}})
    loaded, tok = load(path)
    assert type(loaded) is type(model) and loaded.config == model.config
    assert loaded.n_heads_per_layer == model.n_heads_per_layer
    assert_same_state(model, loaded)
    ids, mask = batch()
    assert torch.equal(model(ids, attention_mask=mask).last_hidden_state, loaded(ids, attention_mask=mask).last_hidden_state)
    assert tok.fingerprint() == tokenizer.fingerprint()
    card = json.loads((path / "card.json").read_text())
    assert card["steps"] == 12 and card["metrics"] == {"loss": 1.5} and card["kind"] == model.kind
    assert "# ckpt" in (path / "README.md").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_tied_weights_are_stored_once_and_reload_tied(tmp_path):
    model = tiny_decoder()
    path = save(model, None, tmp_path / "d")
    names = set(load_file(str(path / "model.safetensors")))
    assert "wte.weight" in names and not any("lm_head" in n for n in names)
    loaded, tok = load(path)
    assert tok is None
    with torch.no_grad():
        loaded.wte.weight[7].add_(1.0)
    ids = torch.tensor([[1, 2, 3]])
    assert_close(loaded(ids).logits, loaded(ids).last_hidden_state @ loaded.wte.weight.T)


def test_overwrite_and_hash(tmp_path):
    a, b = tiny_encoder(), tiny_encoder(position="rope")
    path = save(a, None, tmp_path / "m")
    h1 = checkpoint_hash(path)
    assert h1 == checkpoint_hash(save(a, None, tmp_path / "m2"))  # same content -> same hash
    save(b, None, path)
    assert checkpoint_hash(path) != h1
    assert load(path)[0].config.position == "rope"


def test_a_failed_save_keeps_the_old_checkpoint_whole_and_no_temporaries(tmp_path, tokenizer):
    path = save(tiny_encoder(), tokenizer, tmp_path / "m")
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}

    class BrokenTokenizer:     # fails after the new weights are written into the temporary folder
        def save(self, folder):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save(tiny_encoder(position="rope"), BrokenTokenizer(), path)
    assert {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_load_lists_missing_extra_and_misshapen_tensors(tmp_path):
    path = save(tiny_encoder(), None, tmp_path / "m")
    state = load_file(str(path / "model.safetensors"))
    del state["blocks.0.norm1.weight"]
    state["blocks.0.surprise"] = torch.zeros(2)
    state["pooler.weight"] = torch.zeros(3, 3)
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        load(path)
    msg = str(err.value)
    assert "blocks.0.norm1.weight" in msg and "blocks.0.surprise" in msg and "pooler.weight" in msg


def test_load_rejects_unknown_kind_and_config_keys(tmp_path):
    path = save(tiny_encoder(), None, tmp_path / "m")
    meta = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**meta, "kind": "mixer"}))
    with pytest.raises(ValueError, match="mixer"):
        load(path)
    meta["config"]["colour"] = "red"
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="colour"):
        load(path)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_saved_files_get_the_mode_open_would(tmp_path, tokenizer, mask, mode):
    # safetensors and mkstemp write 0600: without a chmod a checkpoint, its training state and the
    # token cache could be read by their owner only, whatever the umask says
    import os

    from plmodels.training import PretrainConfig
    from plmodels.training.corpus import tokenize_to_cache
    from plmodels.training.runtime import make_optimizer
    from plmodels.training.state import save_train_state

    old = os.umask(mask)
    try:
        model = tiny_encoder()
        path = save(model, tokenizer, tmp_path / "ckpt")
        save_train_state(path, make_optimizer(model, PretrainConfig(kind="encoder", train_source="x")), {"step": 1})
        tokenize_to_cache(["the cat sat", "a dog ran"], tokenizer, tmp_path / "c.ids", key={"k": 1}, progress=False)
    finally:
        os.umask(old)
    files = [p for p in path.rglob("*") if p.is_file()] + [tmp_path / "c.ids", tmp_path / "c.ids.meta.json"]
    assert {p.name for p in files} >= {"model.safetensors", "train_state.safetensors", "train_state.json",
                                        "config.json", "card.json"}
    bad = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in files if p.stat().st_mode & 0o777 != mode}
    assert bad == {}


# ------------------------------------------------------------------ damaged files (issue 75)
def _damage(path, how):
    """Damage one file of a checkpoint folder as a cut copy, a hand edit or a full disk would."""
    if how == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "flip":   # same size, one byte changed: only the checksum sees it
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.write_text(how)


@pytest.mark.parametrize("name,how,expected", [
    ("model.safetensors", "truncate",
     r"model\.safetensors: not a readable safetensors file .*; sha256 \w+\.\.\. does not match checksums\.json"),
    ("config.json", '{"kind": "encoder", "config": {', r"config\.json: invalid JSON at line 1"),
    ("config.json", '{"kind": "lstm", "config": {}}', r"config\.json: unknown model kind 'lstm'"),
    ("config.json", '[1, 2]', r"config\.json: expected keys 'kind' and 'config', got list"),
    ("checksums.json", '{"model.safetensors": ', r"checksums\.json: invalid JSON"),
    ("tokenizer/tokenizer.json", '{"version": ', r"tokenizer: not a readable tokenizer folder"),
])
def test_a_damaged_file_is_one_error_naming_it(tmp_path, tokenizer, name, how, expected):
    path = save(tiny_encoder(), tokenizer, tmp_path / "ckpt")
    _damage(path / name, how)
    with pytest.raises(ValueError, match=expected) as e:
        load(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_truncated_weights_file_without_checksums_is_named(tmp_path, tokenizer):
    """A folder without checksums.json (older versions, other writers): safetensors' own error,
    which names no file, comes back naming it."""
    path = save(tiny_encoder(), tokenizer, tmp_path / "ckpt")
    (path / "checksums.json").unlink()
    load(path)   # still readable as it is
    _damage(path / "model.safetensors", "truncate")
    with pytest.raises(ValueError, match=r"ckpt/model\.safetensors: not a readable safetensors file"):
        load(path)


def test_the_checksum_is_written_last_and_matches_the_weights(tmp_path, tokenizer):
    import hashlib

    path = save(tiny_encoder(), tokenizer, tmp_path / "ckpt")
    sums = json.loads((path / "checksums.json").read_text())
    assert sums == {"model.safetensors": hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()}
    files = [p for p in path.rglob("*") if p.is_file()]
    assert max(files, key=lambda p: p.stat().st_mtime_ns).name == "checksums.json"
    # weights changed inside, the file still complete: they load, with a warning naming the file
    _damage(path / "model.safetensors", "flip")
    with pytest.warns(UserWarning, match=r"ckpt/model\.safetensors: sha256 \w+\.\.\. does not match checksums"):
        load(path)


def test_a_damaged_card_is_named(tmp_path, tokenizer):
    from plmodels.checkpoint import read_card

    path = save(tiny_encoder(), tokenizer, tmp_path / "ckpt", card={"steps": 3})
    assert read_card(path).steps == 3
    (path / "card.json").write_text('{"steps": 3,')
    with pytest.raises(ValueError, match=r"ckpt/card\.json: invalid JSON at line 1"):
        read_card(path)
