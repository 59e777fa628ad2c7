"""research: the harnesses, scripts, configs and lab notebook behind the workbench's shipped recipes.

Not part of the product: nothing in `plmodels`, `probes`, `workbench` or `apps` imports it, and it
is not installed by `pip install .`. It imports the product like any user would. Run its entry
points from the repository root as modules, e.g.

    python -m research.ablate research/configs/ablations/encoder-time.json runs/abl/encoder
    python -m research.scripts.pos_probe_c runs/enc/final --test all

- `ablate.py`: pretraining ablations at an equal token or time budget, measured by the targets;
- `scripts/`: one-off measurements (POS probe regularisation, POS in context, equal-token screens);
- `configs/ablations/`: the ablation specs of each round;
- `notebook.md`: the dated lab notebook of the CPU-hour recipe (docs/recipe.md is its summary).
"""
