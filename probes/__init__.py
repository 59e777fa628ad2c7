"""probes: pure analyses on arrays (activation-store vectors, attention maps) and small probe models.

Kept light on purpose: import submodules directly, e.g. `from probes.edge import EdgeProbe`,
`from probes.layers import per_layer_scores`, `from probes.mdl import online_codelength`. Probes are
shaped like scikit-learn estimators (`estimator`); none needs a checkpoint on disk. Each module's
docstring cites its paper.

    What a layer's vectors hold
    edge.py              edge-probing classifiers (Tenney et al. 2019a)
    pooling.py           span pooling operators for edge probing
    layers.py            per-layer scores, expected layer, center of gravity (Tenney et al. 2019b)
    scalar_mix.py        ELMo's scalar mix of K layers (Peters et al. 2018)
    logreg.py            multinomial logistic regression with L-BFGS in torch
    mdl.py               online-code description length (Voita & Titov 2020)
    structural.py        structural probes: distance and depth (Hewitt & Manning 2019)
    arcs.py              dependency-arc probe and its control task (Hewitt & Liang 2019)
    estimator.py         what the per-sentence probes share as scikit-learn shaped estimators
    controls.py          control tasks and baselines (Hewitt & Liang 2019)
    cka.py               centered kernel alignment between representations (Kornblith et al. 2019)
    flow.py              token identity and prediction through the layers (Voita et al. 2019)
    lens.py              the logit lens and the tuned lens (Belrose et al. 2023)

    Attention heads
    heads.py             head roles over a corpus of word-level attention maps (Clark et al. 2019)
    head_similarity.py   distances between heads (Clark et al. 2019, sec. 6)
    cross_attention.py   encoder-decoder cross-attention heads: where a target position looks
    importance.py        head importance for the model's objective (Michel et al. 2019)
    l0.py                L0-regularised head gates (Voita et al. 2019)
    pruning.py           pruning metrics and curves, real pruning, importance comparisons

    Causal tests and behaviour
    amnesic.py           removing a property from a layer's vectors (Elazar et al. 2021)
    attribution.py       attribution of one prediction to its input tokens, and its faithfulness
    patching.py          activation, path and attribution patching at a model's hook sites
    mediation.py         total, natural indirect and direct effects (Vig et al. 2020), interchange intervention accuracy
    das.py               distributed alignment search: interchange on a learned rotated subspace (Geiger et al. 2023)
    sentence_scores.py   which of two sentences a language model prefers (minimal pairs)
    ngram.py             the Witten-Bell bigram floor of the minimal-pair evaluation

    Uncertainty
    stats.py             intervals over seeds and over test items
    multibootstrap.py    the multi-bootstrap over pretraining seeds and items (Sellam et al. 2022)
"""
