"""The provenance `import_hf` writes on an imported checkpoint's card (issue 79): the source folder,
the sha256 of its config.json and of its weight files (one file: its own sha256, the number a hub
publishes; shards: every one of them), and the seed and step the caller says it is."""
from __future__ import annotations

import pytest

from plmodels.checkpoint import file_sha256, read_card
from plmodels.hf.registry import import_hf, provenance
from tests.plmodels.hf_bert_folder import save_bert_folder

transformers = pytest.importorskip("transformers")


@pytest.fixture
def bert_folder(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=24, max_position_embeddings=64)
    return save_bert_folder(transformers.BertForMaskedLM(cfg).eval(), tmp_path / "bert")


def test_the_card_records_the_source_its_hashes_and_the_claims(bert_folder, tmp_path):
    import_hf(bert_folder, tmp_path / "ours", seed=4, step=2000)
    card = read_card(tmp_path / "ours")
    assert card.provenance == {"source": str(bert_folder), "config_sha256": file_sha256(bert_folder / "config.json"),
                               "weights": ["model.safetensors"],
                               "weights_sha256": file_sha256(bert_folder / "model.safetensors"),
                               "claimed_seed": 4, "claimed_step": 2000}
    import_hf(bert_folder, tmp_path / "plain")       # `workbench import-hf`: no claims, the same hashes
    plain = read_card(tmp_path / "plain").provenance
    assert (plain["claimed_seed"], plain["claimed_step"]) == (None, None)
    assert plain["weights_sha256"] == card.provenance["weights_sha256"]


def test_provenance_hashes_every_shard(bert_folder, tmp_path):
    """A sharded folder's weights checksum covers each shard: one flipped bit in the second shard
    changes it, while the config's hash stays."""
    model = transformers.BertForMaskedLM.from_pretrained(bert_folder)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="20KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1
    p = provenance(sharded, seed=3, step=7)
    assert p["weights"] == ["model.safetensors.index.json"] + [s.name for s in shards]
    assert (p["claimed_seed"], p["claimed_step"], p["source"]) == (3, 7, str(sharded))
    data = bytearray(shards[1].read_bytes())
    data[-1] ^= 1
    shards[1].write_bytes(bytes(data))
    assert provenance(sharded, 3, 7)["weights_sha256"] != p["weights_sha256"]
    assert provenance(sharded, 3, 7)["config_sha256"] == p["config_sha256"]
