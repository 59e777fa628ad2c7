"""app_pages: one Streamlit page per file, each widgets -> one workbench call -> one figure.

    runs.py         what has been trained or imported, training curves, model cards
    layers.py       probing score per layer, mixing weights, the pipeline summary
    heads.py        the head grid by role or score, best head per relation, attention on a sentence
    pruning.py      pruning curves per method, the importance grid, pruned speed and size
    compare.py      finetuned vs frozen: CKA, probing deltas, head change
    causal.py       amnesic probing, head gating and the other causal tests beside their floors
    pairs.py        minimal pairs: accuracy per suite and phenomenon beside its floors
    flow.py         information flow: MI and lens curves beside their floors, a typed sentence's lens and attributions
    interventions.py  agreement mediation: effects per layer and head beside the floors, one item at one site
    objectives.py   the zoo: systems that differ only in their pretraining objective, with seeds
    playground.py   type a sentence: predictions or continuation, and the attention on it
"""
