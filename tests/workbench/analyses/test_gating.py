"""workbench.analyses.gating: a planted previous-token head is the only head whose gating removes
"the previous token's identity" from the layer above (the token's own identity stays); the passport
joins by hand-made tables; the real pipeline on a tiny EWT encoder writes the documented rows."""
import numpy as np
import pandas as pd
import pytest
import torch

import plmodels
from plmodels.checkpoint import build_model
from plmodels.encoder import Encoder, EncoderConfig
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from probes.logreg import LogisticRegressionLBFGS
from workbench.analyses.amnesic import HeldOut, run_model, without_lm_rows
from workbench.analyses.gating import (
    GateRunConfig,
    ReadOut,
    Unit,
    gate_effects,
    gate_model,
    gating_units,
    head_passport,
)
from workbench.core.paths import data_root
from workbench.data.tasks import ud_sentences

V, T, D, DH = 8, 6, 32, 16  # tokens, positions, width, head width (2 heads)


def planted_encoder() -> Encoder:
    """Pre-LN, one block, two heads, MLP off. Tokens are one-hot in dims 0-7, positions in 8-15. Head 0
    attends from position i to i-1 (query = own position, key = position + 1) and copies the attended
    token's one-hot into dims 16-23; head 1 has random weights and writes into dims 24-31 only. The
    MLM head decodes dims 16-23: the "LM" predicts the previous token (the batches' labels)."""
    torch.manual_seed(0)
    m = Encoder(EncoderConfig(vocab_size=V, d_model=D, n_layers=1, n_heads=2, d_ff=4, max_positions=T,
                              norm="pre", dropout=0.0, type_vocab_size=0))
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for ln in (m.blocks[0].norm1, m.blocks[0].norm2, m.final_norm, m.mlm.norm):
            ln.weight.fill_(1.0)
        m.embeddings.word.weight[:, :V] = 4 * torch.eye(V)
        m.embeddings.position.weight[:, V:V + T] = 4 * torch.eye(T)
        W = m.blocks[0].attn.qkv.weight  # (3 D, D): q rows, k rows, v rows; head h = rows h*DH..(h+1)*DH
        c = 3.0
        for t in range(T):
            W[t, V + t] = c                  # head 0 query slot t <- own position t
            if t + 1 < DH:
                W[D + t + 1, V + t] = c      # head 0 key slot t+1 <- position t: query i meets key i-1
        for s in range(V):
            W[2 * D + s, s] = 1.0            # head 0 value = token one-hot
        g = torch.Generator().manual_seed(1)
        for block in range(3):               # head 1: random q, k, v
            W[block * D + DH: block * D + 2 * DH] = torch.randn(DH, D, generator=g) * 0.3
        out = m.blocks[0].attn.out.weight    # (D, D): columns h*DH.. are head h
        out[16:16 + V, :V] = torch.eye(V)
        out[24:32, DH:2 * DH] = torch.randn(8, DH, generator=g) * 0.3
        m.mlm.dense.weight[:V, 16:16 + V] = 2 * torch.eye(V)  # the LM head reads the copied previous token
    return m.eval()


def token_batches(n_batches: int, seed: int) -> HeldOut:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        ids = torch.randint(0, V, (16, T), generator=g)
        labels = torch.full_like(ids, -100)
        labels[:, 2] = ids[:, 1]  # the planted LM's task: the previous token
        masked = ids.clone()
        masked[:, 2] = 0
        firsts = torch.tensor([(b, t) for b in range(16) for t in range(1, T)])  # position 0 has no previous
        mask = torch.ones_like(ids)
        out.append({"ids": ids, "mask": mask, "lm": {"input_ids": masked, "attention_mask": mask, "labels": labels},
                    "firsts": firsts})
    return HeldOut(out)


def token_labels(data: HeldOut) -> dict[str, np.ndarray]:
    own = np.concatenate([b["ids"][:, 1:].reshape(-1).numpy() for b in data.batches])
    prev = np.concatenate([b["ids"][:, :-1].reshape(-1).numpy() for b in data.batches])
    return {"own": own.astype(str).astype(object), "previous": prev.astype(str).astype(object)}


def test_gating_a_planted_head_removes_only_what_it_carries():
    model = planted_encoder()
    train, held = token_batches(8, seed=0), token_batches(4, seed=1)
    _, vecs = run_model(model, train, layers=[1])
    ytr = token_labels(train)
    probes = {(task, 1): LogisticRegressionLBFGS(C=10.0).fit(vecs[1], y.astype(str)) for task, y in ytr.items()}
    units = [Unit("head", "L0.H0", ((0, 0),)), Unit("head", "L0.H1", ((0, 1),))]
    t = gate_effects(model, held, ReadOut(probes, token_labels(held)), units, "planted")
    acc = t[t.metric == "probe_acc"].set_index(["name", "task"])["value"]
    assert acc[("intact", "own")] > 0.99 and acc[("intact", "previous")] > 0.99
    assert acc[("L0.H0", "previous")] < 0.3      # the planted head's information is gone (chance 1/8)
    assert acc[("L0.H0", "own")] > 0.99           # the residual stream still carries the token itself
    assert acc[("L0.H1", "previous")] > 0.95 and acc[("L0.H1", "own")] > 0.99  # the other head carries neither
    d = t[t.metric == "probe_acc_delta"].set_index(["name", "task"])["value"]
    assert d[("L0.H0", "previous")] == pytest.approx(acc[("L0.H0", "previous")] - acc[("intact", "previous")])
    lm = t[t.metric == "lm_loss_delta"].set_index("name")["value"]
    loss = t[t.metric == "lm_loss"].set_index("name")["value"]
    assert loss["intact"] < 0.5 * np.log(V) and loss["L0.H0"] == pytest.approx(np.log(V), abs=0.05)  # -> uniform
    assert lm["L0.H0"] == pytest.approx(loss["L0.H0"] - loss["intact"]) and abs(lm["L0.H1"]) < 1e-6
    assert set(t[t.unit == "head"]["gate_layer"]) == {0} and set(t[t.unit == "head"]["gate_head"]) == {0, 1}
    # an untrained LM head (an imported sentence encoder): no loss, the same vectors, no LM rows
    loss, same = run_model(model, HeldOut(held.batches, lm=False), layers=[1])
    assert np.isnan(loss) and np.array_equal(same[1], run_model(model, held, layers=[1])[1][1])
    assert not without_lm_rows(t, lm=False)["metric"].str.startswith("lm_").any()


def test_units_share_random_sets_by_size():
    classes = pd.DataFrame({"model": "m", "layer": [0, 0, 1, 1, 1], "head": [0, 1, 0, 1, 1],
                            "role": ["syntactic:nsubj", "syntactic:obj", "cls_sink", "none", "broad"],
                            "primary": [True, True, True, False, True]})
    units = gating_units(2, 2, classes, ("head", "role", "family"), random_draws=3, seed=0)
    kinds = pd.Series([u.kind for u in units]).value_counts()
    assert kinds["head"] == 4
    names = {(u.kind, u.name): u.heads for u in units if u.kind in ("role", "family")}
    assert names[("family", "syntactic")] == ((0, 0), (0, 1)) and names[("family", "sink")] == ((1, 0),)
    assert ("role", "none") not in names
    sizes = {len(h) for h in names.values()}
    rand = [u for u in units if u.kind == "random"]
    assert {len(u.heads) for u in rand} == sizes and len(rand) == 3 * len(sizes)
    assert all(len(set(u.heads)) == len(u.heads) for u in rand)


def test_passport_joins_by_hand():
    g = pd.DataFrame([
        ("m", "none", "intact", -1, -1, 0, -1, "pos", 2, "probe_acc", 0.9),
        ("m", "head", "L0.H0", 0, 0, 1, -1, "lm", -1, "lm_loss_delta", 0.5),
        ("m", "head", "L0.H0", 0, 0, 1, -1, "pos", 1, "probe_acc_delta", -0.3),
        ("m", "head", "L0.H0", 0, 0, 1, -1, "pos", 2, "probe_acc_delta", -0.1),
        ("m", "head", "L1.H0", 1, 0, 1, -1, "lm", -1, "lm_loss_delta", 0.2),
        ("m", "head", "L1.H0", 1, 0, 1, -1, "pos", 2, "probe_acc_delta", 0.05),
    ], columns=["model", "unit", "name", "gate_layer", "gate_head", "n_gated", "draw", "task", "layer", "metric",
                "value"])
    classes = pd.DataFrame({"model": "m", "layer": [0, 0, 1], "head": [0, 0, 0],
                            "role": ["positional:-1", "previous_token", "none"], "primary": [True, False, True]})
    imp = pd.DataFrame({"model": "m", "method": "michel", "layer": [0, 1], "head": [0, 0], "value": [2.0, 1.0]})
    p = head_passport(g, classes, imp).set_index(["layer", "head"])
    assert p.loc[(0, 0), "lm_loss_delta"] == 0.5 and p.loc[(1, 0), "lm_loss_delta"] == 0.2
    assert p.loc[(0, 0), "pos_acc_delta"] == -0.1       # at the top probe layer (2)
    assert p.loc[(0, 0), "pos_max_drop"] == pytest.approx(0.3) and p.loc[(0, 0), "pos_max_drop_layer"] == 1
    assert p.loc[(1, 0), "pos_max_drop"] == pytest.approx(-0.05)  # gating it helped: a negative drop
    assert p.loc[(0, 0), "role"] == "positional:-1" and p.loc[(0, 0), "roles"] == "positional:-1,previous_token"
    assert p.loc[(1, 0), "prune_rank_michel"] == 0 and p.loc[(0, 0), "prune_rank_michel"] == 1
    assert p.loc[(0, 0), "importance_michel"] == 2.0


@pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")
def test_gate_model_on_ewt(tmp_path):
    texts = [" ".join(s.words) for s in ud_sentences("ewt", "train")[:400]]
    tok = Tokenizer.train_wordpiece(texts, 400)
    torch.manual_seed(0)
    fields = {**preset("encoder", "tiny"), "vocab_size": tok.vocab_size, "dropout": 0.0, "pad_token_id": tok.pad_id}
    path = tmp_path / "tiny"
    plmodels.save(build_model("encoder", fields), tok, path)
    model = plmodels.load(path)[0]
    L, H = model.config.n_layers, model.config.n_heads
    classes = pd.DataFrame({"model": "tiny", "layer": [0, 1], "head": [0, 1], "role": ["broad", "broad"],
                            "primary": True})
    out = tmp_path / "run"
    (out / "tables").mkdir(parents=True)
    classes.to_parquet(out / "tables" / "heads_classes.parquet")
    cfg = dict(tasks=["pos", "ner"], random_draws=2, max_train_targets=1500, lm_sentences=24, batch_size=12)
    tables = gate_model(path, out_dir=out, config=cfg, progress=False)
    g = tables["gating"]
    assert set(g["unit"]) == {"none", "head", "family", "role", "random"}
    assert len(g[(g.unit == "head") & (g.metric == "lm_loss")]) == L * H
    assert set(g[g.metric == "probe_acc"]["task"]) == {"pos", "ner"}
    top = g[(g.unit == "head") & (g.gate_layer == L - 1) & (g.metric == "probe_acc")]
    assert set(top["layer"]) == {L}   # a last-layer head can only change the last hidden state
    p = tables["head_passport"]
    assert len(p) == L * H and {"role", "roles", "lm_loss_delta", "pos_acc_delta", "ner_max_drop"} <= set(p.columns)
    assert p.set_index(["layer", "head"]).loc[(0, 0), "role"] == "broad"
    assert (out / "tables" / "gating.parquet").exists() and (out / "gate_run.json").exists()


def test_config_is_checked():
    with pytest.raises(ValueError, match="units"):
        GateRunConfig(units=("neuron",))
