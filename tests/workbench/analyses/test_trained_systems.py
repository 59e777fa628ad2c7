"""The BERT-family systems' checkpoints (docs/objectives.md), trained from their shipped `-tiny`
recipes for a few steps, run through probing and the head analysis unchanged: ELECTRA's
discriminator, SpanBERT, ALBERT (shared layers, factorised embeddings) and a DistilBERT student."""
from __future__ import annotations

import pytest

from plmodels.training import pretrain
from workbench.analyses.heads import analyse_heads
from workbench.analyses.probing import probe_model
from workbench.core.paths import data_root

pytestmark = pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir() or
                                not (data_root() / "tiny_shakespeare").exists(), reason="data root missing")

PROBE = dict(tasks=["pos"], modes=["single", "control"], seeds=[0], max_train_targets=300, max_eval_targets=150,
             max_epochs=2, n_boot=0, hidden=16, proj_dim=16)
HEADS = {"max_sentences": 30, "n_boot": 10, "freq_max_chars": 20000, "similarity_max_words": 100}
SHORT = {"max_steps": 3, "eval_every": 0, "eval_sequences": 16, "ckpt_log_spaced": False, "num_threads": 1,
         "tokenizer_sample_chars": 200_000, "max_train_texts": None}


@pytest.mark.slow
def test_each_system_runs_through_probing_and_heads(tmp_path, one_thread):
    run = tmp_path / "run"
    bert = pretrain("bert-tiny", run / "train" / "bert", overrides=SHORT)
    tok = str(bert.parent / "tokenizer")
    finals = {"bert": bert}
    for name in ("electra", "spanbert", "albert"):
        finals[name] = pretrain(f"{name}-tiny", run / "train" / name, overrides={**SHORT, "tokenizer_path": tok})
    finals["distilbert"] = pretrain("distilbert-tiny", run / "train" / "distilbert",
                                    overrides={**SHORT, "objective_args": {"teacher": str(bert)}})
    for name, final in finals.items():
        probing = probe_model(final, out_dir=run, config=PROBE, progress=False, model_name=name)["probing"]
        n_layers = 1 if name == "distilbert" else 2
        assert set(probing["layer"][probing["mode"] == "single"]) == set(range(n_layers + 1)), name
        assert probing[probing["metric"] == "accuracy"]["value"].between(0, 1).all()
        heads = analyse_heads(final, out_dir=run, config=HEADS, progress=False, model_name=name)
        assert len(heads["heads_classes"].drop_duplicates(["layer", "head"])) == n_layers * 2, name
