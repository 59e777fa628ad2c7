"""The flow suite's classifier target (workbench.analyses.flow.classifier_prediction): a tiny classifier
with a planted answer (tests/workbench/analyses/planted_classifier.py: the label is one cue word) has
its predicted class's logit attributed, the attention methods find the cue, and deleting their top
token moves the decision more than deleting a random one; a finetuned checkpoint folder is read as a
classifier by `flow_model` (its task's dev sentences, no lens)."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

import plmodels
from plmodels.files import save_safetensors
from plmodels.training.finetune import HEAD_FILE, INFO_FILE
from tests.workbench.analyses.planted_classifier import planted_classifier, planted_sentences
from workbench.analyses.flow import (ATTR_COLUMNS, FlowRunConfig, _attributions, attribution_rows,
                                     classifier_prediction, flow_model)
from workbench.core.paths import data_root

CFG = FlowRunConfig(n_boot=50, random_draws=3)


@pytest.fixture(scope="module")
def planted():
    torch.set_num_threads(1)
    clf, tok = planted_classifier(steps=60)
    items = planted_sentences(20, seed=9)
    return clf, tok, [(torch.tensor(tok.encode(" ".join(w))), y, 1 + at) for w, y, at in items]  # [CLS] first


@pytest.mark.slow
def test_the_predicted_class_is_attributed_and_rollout_and_flow_find_the_cue(planted):
    clf, tok, items = planted
    predict = classifier_prediction(clf, tok)
    top = {"rollout": [], "flow": []}
    for ids, label, cue in items:
        assert all(len(tok.encode(w, add_special=False)) == 1 for w in tok.decode(ids.tolist()).split())
        p = predict(ids, np.random.default_rng(0))
        assert p.label == label  # the class the classifier predicts (it learnt the cue: all 20 right)
        assert p.read == 0  # an encoder's summary token, [CLS]
        assert list(p.positions) == list(range(1, len(ids) - 1))  # every word, no [CLS] / [SEP]
        with torch.no_grad():
            logits = clf(ids[None], torch.ones_like(ids[None]))[0]
        assert float(p.score(ids[None])[0]) == pytest.approx(float(logits[label]), abs=1e-5)
        a = _attributions(clf.base, tok, p, CFG)
        for m in top:
            top[m].append(a["pos"][int(np.argmax(a["scores"][m]))] == cue)
    assert np.mean(top["rollout"]) >= 0.9 and np.mean(top["flow"]) >= 0.9, top


@pytest.mark.slow
def test_deletion_of_the_decision_beats_the_random_floor(planted):
    clf, tok, items = planted
    # one deletion step: the top-scored token alone, the cue for rollout and flow (the test above), the
    # cue one time in 6-10 for a random score. (Insertion is not asserted here: one word put back into a
    # sentence of padding vectors barely moves this classifier, whichever word it is.)
    cfg = FlowRunConfig(n_boot=50, random_draws=3, deletion_k=1)
    rows = attribution_rows("planted", clf.base, tok, [ids.tolist() for ids, _, _ in items], cfg,
                            classifier_prediction(clf, tok), "planted")
    t = pd.DataFrame(rows, columns=ATTR_COLUMNS).set_index(["method", "metric"])
    assert set(t["target"]) == {"planted"}
    rnd = t.loc[("random", "aopc")]
    for m in ("rollout", "flow"):
        assert t.loc[(m, "aopc")].ci_low > rnd.ci_high, (m, t.loc[(m, "aopc")], rnd)
    assert t.loc[("random", "aopc"), "n_items"] == len(items)


@pytest.mark.slow
@pytest.mark.skipif(not (data_root() / "glue_sst2").is_dir() or not (data_root() / "ud_english_ewt").is_dir(),
                    reason="data root missing")
def test_a_finetuned_checkpoint_is_read_as_its_classifier(planted, tmp_path):
    clf, tok, _ = planted
    path = tmp_path / "clf"
    plmodels.save(clf.base, tok, path)
    save_safetensors(clf.head.state_dict(), path / HEAD_FILE)
    (path / INFO_FILE).write_text(json.dumps({"task": "sst2", "kind": "sentence", "labels": ["negative", "positive"],
                                              "head_dropout": 0.0}))
    cfg = dict(n_sentences=30, attr_sentences=4, n_tokens=8, n_clusters=8, n_boot=10, random_draws=2,
               estimators=["kmeans"], max_tokens=24)
    t = flow_model(path, out_dir=tmp_path / "run", config=cfg, lens_dir=tmp_path / "lens")
    a = t["flow_attribution"]
    assert set(a["target"]) == {"sst2"} and a[a.metric == "aopc"].n_items.max() == 4
    assert t["flow_lens"].empty and not (tmp_path / "lens").exists()  # no lens: the head is not an LM's
    assert json.loads((tmp_path / "run" / "flow_run.json").read_text())["attribution_target"] == "sst2"
