"""The BERT-family systems through `pretrain` (objectives.py): each trains, writes a checkpoint every
analysis reads as a plain encoder, saves what only training needs beside it, and resumes bit-exact."""
import json

import pytest
import torch
from safetensors.torch import load_file

from plmodels.checkpoint import load, read_card
from plmodels.encoder import Encoder
from plmodels.training import load_config, pretrain
from plmodels.training.loop import run_training
from plmodels.training.objectives import OBJECTIVE_FILE, OBJECTIVES

from .toy_runs import fixed_wordpiece, toy_config, toy_corpus

SYSTEMS = {
    "bert": {"masking": {"nsp": True}},
    "roberta": {"grad_accum": 2},
    "spanbert": {"objective": "span"},
    "electra": {"objective": "electra", "model": {"embedding_size": 16},
                "masking": {"mask_frac": 0.85, "random_frac": 0.0}},
    "albert": {"model": {"embedding_size": 16, "share_layers": "all"}, "masking": {"sop": True}},
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    return toy_corpus(d / "train.txt", 2000, 0), toy_corpus(d / "valid.txt", 200, 1)


@pytest.fixture(scope="module")
def tok(data, tmp_path_factory):
    return fixed_wordpiece(data[0], tmp_path_factory.mktemp("tok"))


def _extras(folder):
    path = folder / OBJECTIVE_FILE
    return load_file(str(path)) if path.is_file() else {}


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_system_trains_saves_and_resumes_bit_exact(data, tok, tmp_path, system):
    cfg = toy_config(data, max_steps=6, tokenizer_path=str(tok), eval_sequences=16, **SYSTEMS[system])
    straight = pretrain(cfg, tmp_path / "a")
    killed = run_training(cfg, tmp_path / "b", stop_at_step=4)  # last checkpoint: step 4
    assert killed.path is None
    resumed = pretrain(cfg, tmp_path / "b")
    wa, wb = load_file(str(straight / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ea, eb = _extras(straight), _extras(resumed)
    assert ea.keys() == eb.keys() and all(torch.equal(ea[k], eb[k]) for k in ea)
    # the analysed model is a plain encoder that loads without the objective
    model, _ = load(straight)
    assert isinstance(model, Encoder)
    out = model(torch.tensor([[2, 10, 11, 12, 3]]), output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == model.config.n_layers + 1 and len(out.attentions) == model.config.n_layers
    card = json.loads((straight / "card.json").read_text())
    rows = [json.loads(r) for r in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    metrics = {r["metric"] for r in rows if r["split"] == "train"}
    name = {"spanbert": "span", "electra": "electra"}.get(system, "mlm")
    assert card["objective_name"] == name
    typed = read_card(straight)  # the trainer writes the card complete: no reader looks at the run folder
    assert typed.objective_args == OBJECTIVES[name].args_class.from_dict(SYSTEMS[system].get("objective_args", {})).to_dict()
    assert typed.objective_args_source == "card" and typed.train_source == str(data[0])
    assert typed.lm_head_trained == (system != "electra")  # ELECTRA's discriminator: its MLM head gets no gradient
    assert all(r["value"] == r["value"] for r in rows)  # no NaN
    if system == "spanbert":
        assert {"mlm_loss", "sbo_loss"} <= metrics and any(k.startswith("sbo.") for k in ea) and "sbo_bias" in ea
    if system == "electra":
        assert {"mlm_loss", "rtd_loss", "rtd_acc", "replaced_frac"} <= metrics
        assert model.config.use_rtd and model.rtd is not None
        gen, _ = load(straight / "generator")  # the generator, a checkpoint of its own
        assert gen.config.d_model == model.config.d_model // 4 and gen.config.embedding_size == 16
        assert torch.equal(gen.embeddings.word.weight, model.embeddings.word.weight)  # shared when trained
        assert read_card(straight / "generator").lm_head_trained  # the generator is a trained MLM
    if system == "albert":
        assert model.config.share_layers == "all" and model.config.use_nsp  # the SOP head
        assert model.blocks[1].attn.qkv.weight is model.blocks[0].attn.qkv.weight
        assert "SOP" in card["objective"]
    if system == "bert":
        assert model.config.use_nsp and "NSP" in card["objective"]


def test_distilbert_student_of_a_trained_teacher(data, tok, tmp_path):
    teacher = pretrain(toy_config(data, max_steps=3, tokenizer_path=str(tok), model={"n_layers": 4}), tmp_path / "teacher")
    cfg = toy_config(data, max_steps=4, objective="distil", objective_args={"teacher": str(teacher)}, eval_sequences=16)
    final = pretrain(cfg, tmp_path / "student")
    student, stok = load(final)
    t, ttok = load(teacher)
    assert student.config.n_layers == 2 and student.config.type_vocab_size == 0
    assert stok.vocab_size == ttok.vocab_size and stok.hf.get_vocab() == ttok.hf.get_vocab()  # the teacher's
    rows = [json.loads(r) for r in (tmp_path / "student" / "metrics.jsonl").read_text().splitlines()]
    assert {"kd", "mlm", "cos"} <= {r["metric"] for r in rows if r["split"] == "train"}
    # the step-1 checkpoint started from the teacher's layers 0 and 2
    first = load_file(str(tmp_path / "student" / "checkpoints" / "step_0000001" / "model.safetensors"))
    assert first["blocks.1.attn.qkv.weight"].shape == t.blocks[2].attn.qkv.weight.shape


def test_system_recipes_resolve():
    got = {name: load_config(name, {"objective_args": {"teacher": "t"}} if "distil" in name else None)
           for size in ("mini", "tiny") for name in
           (f"bert-{size}", f"roberta-{size}", f"spanbert-{size}", f"electra-{size}", f"albert-{size}",
            f"distilbert-{size}")}
    mini = {k.removesuffix("-mini"): v for k, v in got.items() if k.endswith("-mini")}
    assert mini["bert"].masking_config.nsp and not mini["roberta"].masking_config.nsp
    assert mini["roberta"].batch_size * mini["roberta"].grad_accum == 4 * mini["bert"].batch_size
    assert mini["spanbert"].objective == "span" and mini["spanbert"].objective_args["max_span"] == 10
    assert mini["electra"].objective == "electra" and mini["electra"].masking_config.random_frac == 0.0
    assert mini["albert"].model["share_layers"] == "all" and mini["albert"].masking_config.sop
    assert mini["distilbert"].objective == "distil"
    assert all(c.preset == "mini" for c in mini.values())
    with pytest.raises(ValueError, match="objective_args.teacher"):
        load_config("distilbert-mini")
    with pytest.raises(ValueError, match="trains a encoder|not a decoder"):
        load_config("decoder-tiny", {"objective": "electra"})


@pytest.mark.parametrize("system", ["electra", "spanbert"])
def test_a_torn_objective_file_is_recognised_and_skipped_for_the_checkpoint_before(data, tok, tmp_path, capsys,
                                                                                  system):
    """ELECTRA's generator (and SpanBERT's SBO head) live in objective.safetensors beside the analysed
    model; checksums.json lists it too, written after it, so a torn one is recognised like torn main
    weights: resuming skips that checkpoint for the one before it, naming the file, and the resumed run
    ends on the uninterrupted run's weights, generator included."""
    from plmodels.training.state import latest_checkpoint

    cfg = toy_config(data, max_steps=5, tokenizer_path=str(tok), eval_sequences=16, **SYSTEMS[system])
    straight = pretrain(cfg, tmp_path / "a")
    run_training(cfg, tmp_path / "b", stop_at_step=5)   # checkpoints at steps 1, 2, 4
    last = tmp_path / "b" / "checkpoints" / "step_0000004"
    assert set(json.loads((last / "checksums.json").read_text())) == {"model.safetensors", OBJECTIVE_FILE}
    torn = last / OBJECTIVE_FILE
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    capsys.readouterr()
    assert latest_checkpoint(tmp_path / "b").name == "step_0000002"
    assert f"skipping the damaged checkpoint step_0000004: {torn}: sha256" in capsys.readouterr().err
    resumed = pretrain(cfg, tmp_path / "b")
    for name in ("model.safetensors", OBJECTIVE_FILE):
        wa, wb = load_file(str(straight / name)), load_file(str(resumed / name))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), name
