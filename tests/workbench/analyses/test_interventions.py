"""The agreement mediation analysis (workbench/analyses/interventions.py) on tiny checkpoints: the items
and their interventions by hand, the residual-stream identity (patching a layer's whole residual stream
is the whole intervention), both LM views, the floors' rows and the clear errors."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import plmodels
from plmodels import Decoder, DecoderConfig, Encoder, EncoderConfig
from plmodels.tokenizer import Tokenizer
from workbench.analyses import interventions as iv
from workbench.cli import main
from workbench.data.pair_templates import INTRANSITIVE, NOUNS, OTHER_NOUNS, PREPOSITIONS, SAY_VERBS, TRANSITIVE

CFG = {"n_per_template": 8, "n_boot": 50, "batch_size": 16}


def _texts() -> list[str]:
    words = [w for pair in NOUNS + OTHER_NOUNS + INTRANSITIVE + TRANSITIVE for w in pair]
    return [" ".join(["The", "the", "that", ".", *PREPOSITIONS, *SAY_VERBS, *words])] * 30


@pytest.fixture(scope="module")
def decoder_ckpt(tmp_path_factory):
    tok = Tokenizer.train_bpe(_texts(), vocab_size=1000)
    torch.manual_seed(1)  # not the random-init floor's seed 0: the two models must differ
    model = Decoder(DecoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                  max_positions=64)).eval()
    folder = tmp_path_factory.mktemp("dec") / "ckpt"
    plmodels.save(model, tok, folder)
    return str(folder)


@pytest.fixture(scope="module")
def decoder_tables(decoder_ckpt, tmp_path_factory):
    return iv.interventions_model(decoder_ckpt, tmp_path_factory.mktemp("out"), CFG)


def test_the_interventions_swap_the_subject_only():
    r = next(r for r in iv.agreement_items(iv.InterventionsConfig.from_dict(CFG)) if r.source == "agr_sent_comp")
    subj = r.critical - r.distance
    for kind, same in (("swap_number", False), ("same_number", True)):
        new = iv.intervene(r, kind, seed=0)
        assert [i for i in range(len(new)) if new[i] != r.good[i]] == [subj]
        sing = {s for s, _ in NOUNS + OTHER_NOUNS}
        assert (new[subj] in sing) == (r.good[subj] in sing) if same else (new[subj] in sing) != (r.good[subj] in sing)
    assert iv.intervene(r, "same_number", 0) == iv.intervene(r, "same_number", 0)  # drawn with the item's id


def test_patching_a_whole_residual_stream_is_the_whole_intervention(decoder_tables):
    """The residual stream at every position after layer l holds everything the output reads: its NIE
    is the TE, its NDE zero and its restored share one, on the trained and the random-init model."""
    t = decoder_tables["interventions"]
    for (variant, intervention), g in t.groupby(["variant", "intervention"]):
        v = g[g.site == "input"].set_index("metric")["value"]
        te = v["te_log"]
        assert te == pytest.approx(v["logit_diff_clean"] - v["logit_diff_corrupt"], abs=1e-9)
        assert 0.0 <= v["accuracy_clean"] <= 1.0
        resid = g[(g.site_kind == "resid_post") & (g.position == "all")].pivot(index="site", columns="metric",
                                                                                values="value")
        assert len(resid) == 2 and abs(te) > 1e-6
        np.testing.assert_allclose(resid["nie_log"], te, atol=1e-5)
        np.testing.assert_allclose(resid["nde_log"], 0.0, atol=1e-5)
        np.testing.assert_allclose(resid["restored"], 1.0, atol=1e-4)
        np.testing.assert_allclose(resid["iia"], v["iia_ceiling"])  # the whole input: the model's own answer
        # the last block's output at the reading position alone is all the decoder's readout sees
        last = g[(g.site == "blocks.1.resid_post@reading") & (g.metric == "nie_log")]["value"].item()
        assert last == pytest.approx(te, abs=1e-5)
        first = g[(g.site == "blocks.0.resid_post@reading") & (g.metric == "nie_log")]["value"].item()
        assert abs(first - te) > 1e-6  # earlier, the subject reaches the reading position by attention later on
    assert set(t["variant"]) == {"trained", "random_init"} and set(t["intervention"]) == {"swap_number", "same_number"}
    means = t[t.metric.str.endswith(("_log", "_ratio")) & ~t.metric.str.startswith("attribution")]
    assert ((means["ci_low"] <= means["value"] + 1e-12) & (means["value"] <= means["ci_high"] + 1e-12)).all()
    te = t[t.metric == "te_log"].set_index(["variant", "intervention"])["value"]
    assert te["trained", "swap_number"] != te["random_init", "swap_number"]
    heads = t[(t.site_kind == "head_out") & (t.metric == "nie_log")]
    assert sorted(set(zip(heads["layer"], heads["head"]))) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_attribution_rows_sit_beside_real_patching(decoder_tables):
    t = decoder_tables["interventions"]
    g = t[(t.variant == "trained") & (t.intervention == "swap_number")].pivot(index="site", columns="metric",
                                                                              values="value").dropna(subset=["nie_log"])
    # heads and sub-layer outputs are small steps: attribution patching is close to real patching there
    # (a whole residual stream swaps the whole input: its first-order estimate was off by 2x here)
    g = g[~g.index.str.contains("resid_post")]
    np.testing.assert_allclose(g["attribution_nie_log"], g["nie_log"], atol=0.2 * g["nie_log"].abs().max())
    a = decoder_tables["interventions_attribution"]
    # 2 layers x (2 heads + attn_out + mlp_out) at every position, and 2 layers x (those + the residual
    # stream) at each of 2 positions; the residual stream at every position (a block of ties) is left out
    assert set(a["sites"]) == {"all", "top10"} and (a[a.sites == "all"]["n_sites"] == 8 + 2 * 10).all()


def test_the_position_grid_patches_each_head_at_one_position(decoder_ckpt, decoder_tables):
    """The last block's heads and sub-layers are read by the decoder's readout at the reading position
    only (the template words are one token each): patched there alone each has its every-position NIE;
    patched at the subject alone, none where the subject is not the reading position (a PP between
    them), all of it where it is (a sentential complement: "... said the author laughs"). A position grid
    that dropped the head (or the position) of a site would break one of these."""
    t = decoder_tables["interventions"]
    g = t[(t.variant == "trained") & (t.metric == "nie_log") & (t.layer == 1) & (t.site_kind != "resid_post")]
    v = g.pivot_table(index=["intervention", "site_kind", "head"], columns="position", values="value")
    assert len(v) == 2 * 4 and v.notna().all().all()  # two interventions x (attn_out, mlp_out, 2 heads)
    np.testing.assert_allclose(v["reading"], v["all"], atol=1e-6)
    assert v["all"].abs().max() > 1e-3  # and the sites do carry an effect
    model, tok = plmodels.load(decoder_ckpt)
    records = iv.agreement_items(iv.InterventionsConfig.from_dict(CFG))
    kept = {r.id for r, _ in iv.kept_items(model, tok, "swap_number", iv.InterventionsConfig.from_dict(CFG))}
    for source, same in (("agr_pp", False), ("agr_sent_comp", True)):
        r = next(r for r in records if r.source == source and r.id in kept)
        nie = {p: iv.item_effect(model, tok, r, "swap_number", iv.Site("blocks.1.attn.head_out", 1, p))
               .set_index("quantity")["value"]["nie_log"] for p in ("subject", None)}
        assert abs(nie[None]) > 1e-4
        assert nie["subject"] == pytest.approx(nie[None] if same else 0.0, abs=1e-6)
    heads = v.xs("head_out", level="site_kind")["reading"]
    assert abs(heads.xs(0, level="head") - heads.xs(1, level="head")).max() > 1e-6  # one head, not the layer


@torch.no_grad()
def _direct_d(model, tok, r, lm_inputs: str) -> float:
    """log p(agreeing form) - log p(other form) of one clean item, from the model's own forward on whole
    sentences (no hooks, no readout of ours): a decoder's next-token log-probabilities of each piece
    after the prefix and the pieces before it; an encoder's MLM head on the sentence with the form's
    pieces from j on masked, at piece j (PLL-word-l2r)."""
    total = 0.0
    for words, sign in ((r.good, 1.0), (r.bad, -1.0)):
        e = tok.encode_words(list(words))
        s, t = e.word_spans[r.critical]
        for p in range(s, t):
            if lm_inputs == "causal":
                logits = model(torch.tensor([e.ids[:t]])).logits[0, p - 1]
            else:
                ids = list(e.ids[:p]) + [tok.mask_id] * (t - p) + list(e.ids[t:])
                logits = model.mlm_logits(model(torch.tensor([ids])).last_hidden_state)[0, p]
            total += sign * float(torch.log_softmax(logits.double(), -1)[e.ids[p]])
    return total


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_a_verb_is_scored_by_all_its_subwords(kind):
    """With a tokenizer that splits the verbs ("laughs" = "laugh" + "s": the two forms share their first
    piece), d(u) is the whole forms' log-probability difference, equal to a direct computation."""
    torch.manual_seed(0)
    if kind == "decoder":
        tok = Tokenizer.train_bpe(_texts(), vocab_size=400)
        model = Decoder(DecoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                      max_positions=64)).eval()
    else:
        tok = Tokenizer.train_wordpiece(_texts(), vocab_size=100)
        model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                      max_positions=64)).eval()
    records = iv.agreement_items(iv.InterventionsConfig.from_dict(CFG))
    items = iv.build_items(model, tok, records, "swap_number", 0)
    assert items.pieces["multi"] >= 5  # the point of the test: forms of several pieces are kept
    clean, _, _ = iv._row_batches(items)
    with torch.no_grad():
        d = items.per_item(iv.form_logprob_score(items)(model, clean).double())
    by_id = {r.id: r for r in records}
    lm = "causal" if kind == "decoder" else "masked"
    direct = torch.tensor([_direct_d(model, tok, by_id[i], lm) for i in items.ids], dtype=torch.float64)
    torch.testing.assert_close(d, direct, atol=2e-5, rtol=0)
    # through the alignment by word, the intervened rows hold the clean rows' tokens outside the subject
    clean_ids, corrupt_ids = items.clean["input_ids"], items.corrupt["input_ids"]
    for row in range(len(clean_ids)):
        to = items.to_corrupt[row]
        outside = [p for p in range(int(items.clean["attention_mask"][row].sum()))
                   if to[p] >= 0 and p != int(items.subject[row])]
        assert clean_ids[row, outside].tolist() == corrupt_ids[row, to[outside]].tolist()
        assert int(to[items.subject[row]]) == int(items.corrupt_subject[row])
    if kind == "encoder":  # l2r: a row masks the piece it reads and every later piece of the form
        ids = items.clean["input_ids"]
        for row in range(len(ids)):
            p = int(items.target_pos[row, 0])
            masked = (ids[row] == tok.mask_id).nonzero()[:, 0].tolist()
            assert masked[0] == p and masked == list(range(p, p + len(masked)))


def _small_vocab(kind: str):
    """A tiny model whose tokenizer splits the template words (so subjects of the two numbers often take
    different numbers of pieces)."""
    torch.manual_seed(0)
    if kind == "decoder":
        tok = Tokenizer.train_bpe(_texts(), vocab_size=400)
        return Decoder(DecoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                     max_positions=64)).eval(), tok
    tok = Tokenizer.train_wordpiece(_texts(), vocab_size=60)  # (at 100 "teacher"/"teachers" split alike)
    model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                  max_positions=64)).eval()
    with torch.no_grad():  # sharper weights: at the default init the subject moves d by ~1e-5, round-off's size
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(6.0)
    return model, tok


@torch.no_grad()
def _direct_patched_d(model, tok, r, lm_inputs: str, hook: str, head: int, noising: bool) -> float:
    """d of the noising run (the clean sentences with `hook`'s head, at every position, taken from the
    intervened sentences) or of the denoising run (the reverse), computed by hand on whole sentences: the
    base position p takes the source's p before the subject, the subject's last piece the other subject's
    last piece, a later position its counterpart shifted by the difference of the subjects' lengths, and a
    subject's other pieces keep their own value when the lengths differ."""
    subj = r.critical - r.distance
    new = iv.intervene(r, "swap_number", 0)[subj]
    total = 0.0
    for words, sign in ((r.good, 1.0), (r.bad, -1.0)):
        swapped = words[:subj] + (new,) + words[subj + 1:]
        eb, es = (tok.encode_words(list(w)) for w in ((words, swapped) if noising else (swapped, words)))
        (ab, bb), (as_, bs) = eb.word_spans[subj], es.word_spans[subj]
        (sb, tb), (ss, ts) = eb.word_spans[r.critical], es.word_spans[r.critical]

        def source_of(p: int) -> int:
            if p < ab:
                return p
            if p < bb - 1:
                return p if bb - ab == bs - as_ else -1
            return p + (bs - bb)

        for j in range(tb - sb):
            if lm_inputs == "causal":
                base_ids, src_ids, read = eb.ids[:tb], es.ids[:ts], sb + j - 1
            else:
                base_ids = list(eb.ids[:sb + j]) + [tok.mask_id] * (tb - sb - j) + list(eb.ids[tb:])
                src_ids = list(es.ids[:ss + j]) + [tok.mask_id] * (ts - ss - j) + list(es.ids[ts:])
                read = sb + j
            cache = {}
            with model.hooks([(hook, lambda t, n: cache.setdefault("src", t.clone()))]):
                model(torch.tensor([src_ids]))

            def patch(t, n):
                out = t.clone()
                for p in range(len(base_ids)):
                    if source_of(p) >= 0:
                        out[0, p, head] = cache["src"][0, source_of(p), head]
                return out
            with model.hooks([(hook, patch)]):
                out = model(torch.tensor([base_ids]))
            logits = out.logits[0, read] if lm_inputs == "causal" else model.mlm_logits(out.last_hidden_state)[0, read]
            total += sign * float(torch.log_softmax(logits.double(), -1)[eb.ids[sb + j]])
    return total


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_a_subject_that_splits_differently_is_kept_and_aligned_by_word(kind):
    """Items whose two subjects take different numbers of subwords are kept (none is skipped as unaligned),
    and their NIE and NDE at a head (every position) equal a computation by hand on whole sentences."""
    model, tok = _small_vocab(kind)
    lm = "causal" if kind == "decoder" else "masked"
    cfg = iv.InterventionsConfig.from_dict(CFG)
    records = iv.agreement_items(cfg)
    items = iv.build_items(model, tok, records, "swap_number", 0)
    assert items.skipped["unaligned"] == 0 and items.aligned["word"] >= 3
    assert len(items.ids) + items.skipped["same_pieces"] == len(records)

    def n_pieces(words, i):
        a, b = tok.encode_words(list(words)).word_spans[i]
        return b - a
    split = [r for r in records if r.id in set(items.ids)
             and n_pieces(r.good, r.critical - r.distance)
             != n_pieces(iv.intervene(r, "swap_number", 0), r.critical - r.distance)]
    assert len(split) >= 3
    for r in split[:3]:
        got = iv.item_effect(model, tok, r, "swap_number", iv.Site("blocks.0.attn.head_out", 1)).set_index(
            "quantity")["value"]
        d = _direct_d(model, tok, r, lm)
        noised = _direct_patched_d(model, tok, r, lm, "blocks.0.attn.head_out", 1, noising=True)
        denoised = _direct_patched_d(model, tok, r, lm, "blocks.0.attn.head_out", 1, noising=False)
        assert got["d_clean"] == pytest.approx(d, abs=2e-5)
        assert got["nie_log"] == pytest.approx(d - noised, abs=2e-5)
        assert got["nde_log"] == pytest.approx(d - denoised, abs=2e-5)
        assert abs(got["nie_log"]) > 1e-5 and abs(got["nde_log"] - got["te_log"]) > 1e-5  # not trivially 0 or TE


def test_an_encoder_run_writes_its_rows(tmp_path):
    tok = Tokenizer.train_wordpiece(_texts(), vocab_size=200)
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                  max_positions=64)).eval()
    plmodels.save(model, tok, tmp_path / "enc")
    t = iv.interventions_model(tmp_path / "enc", None, {**CFG, "floors": [], "interventions": ["swap_number"],
                                                       "attribution": False})["interventions"]
    assert set(t["variant"]) == {"trained"} and "attribution_nie_log" not in set(t["metric"])


def test_a_model_whose_lm_head_is_untrained_is_not_measured(tmp_path):
    tok = Tokenizer.train_wordpiece(_texts(), vocab_size=200)
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                  max_positions=64)).eval()
    plmodels.save(model, tok, tmp_path / "disc", card={"objective_name": "electra"})   # no trained MLM head
    plmodels.save(model, tok, tmp_path / "mlm", card={"objective_name": "mlm"})
    cfg = {**CFG, "floors": [], "interventions": ["swap_number"], "attribution": False}
    t = iv.interventions_model(tmp_path / "disc", tmp_path / "out", cfg)
    assert t["interventions"].empty and t["interventions_attribution"].empty
    assert "LM head is untrained" in json.loads((tmp_path / "out" / "interventions_run.json").read_text())["not_measured"]
    assert len(iv.interventions_model(tmp_path / "mlm", None, cfg)["interventions"])   # the same weights, a trained head


def test_bad_inputs_are_one_clear_error():
    with pytest.raises(ValueError, match=r"InterventionsConfig.templates: \['refl_simple'\]"):
        iv.InterventionsConfig(templates=("refl_simple",))
    with pytest.raises(ValueError, match="must include 'swap_number'"):
        iv.InterventionsConfig(interventions=("same_number",))
    from plmodels import ElmoBiLM, ElmoConfig
    tok = Tokenizer.train_wordpiece(_texts(), vocab_size=200)
    bilm = ElmoBiLM(ElmoConfig(vocab_size=tok.vocab_size, d_embed=8, d_hidden=24, d_proj=8, n_layers=2, dropout=0.0))
    with pytest.raises(ValueError, match=r"a bilm model has no agreement view .* \['causal', 'masked'\]"):
        iv.build_items(bilm, tok, iv.agreement_items(iv.InterventionsConfig.from_dict(CFG)), "swap_number", 0)


def test_the_cli_writes_the_tables_and_names_a_bad_field_in_one_line(decoder_ckpt, tmp_path, capsys):
    argv = ["patch", decoder_ckpt, "--out", str(tmp_path)]
    assert main(argv + ["--set", "n_boot=0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "InterventionsConfig.n_boot must be >= 1" in err[0]
    assert not (tmp_path / "tables").exists()  # refused before any work
    overrides = ["--set", "n_per_template=4", "--set", "n_boot=20", "--set", "floors=[]", "--set",
                 'interventions=["swap_number"]', "--set", "attribution=false"]
    assert main(argv + overrides) == 0
    t = pd.read_parquet(tmp_path / "tables" / "interventions.parquet")
    assert set(t["variant"]) == {"trained"} and (t["n_items"] > 0).all()
