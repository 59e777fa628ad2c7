"""The training state of a checkpoint, beside the model (no pickles), and when checkpoints are written.

A checkpoint folder is a `plmodels.save` folder plus `train_state.safetensors` (the optimizer's
tensors) and `train_state.json` (step, tokens, elapsed time, data position, seed, param groups);
the JSON is written last, so a folder without it is an unfinished checkpoint and
`latest_checkpoint` skips it (the pretraining loop also builds each checkpoint folder aside and
renames it in whole, so such a folder comes only from older versions or other writers). Checkpoints fall every `ckpt_every` steps and, with
`ckpt_log_spaced`, at steps 1, 2, 4, 8, ... (to follow how structure emerges early).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from plmodels.files import save_safetensors, write_json_atomic

from .config import PretrainConfig


STATE_TENSORS, STATE_JSON = "train_state.safetensors", "train_state.json"


def save_train_state(folder: Path, optimizer: torch.optim.Optimizer, info: dict) -> None:
    """Optimizer state flattened to safetensors ("optim.{param}.{name}") + JSON (param groups, step...).

    `train_state.json` is written last: a folder without it is an unfinished checkpoint.
    """
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"optim.{pid}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{k}"] = v
    save_safetensors(tensors, folder / STATE_TENSORS)
    write_json_atomic(folder / STATE_JSON, {**info, "param_groups": sd["param_groups"], "scalar_state": scalars})


def load_train_state(folder: Path, optimizer: torch.optim.Optimizer) -> dict:
    """Restore the optimizer from a checkpoint folder; returns the JSON info (step, tokens, ...)."""
    info = json.loads((folder / STATE_JSON).read_text(encoding="utf-8"))
    tensors = load_file(str(folder / STATE_TENSORS))
    state: dict[int, dict] = {}
    for key, v in tensors.items():
        _, pid, name = key.split(".", 2)
        state.setdefault(int(pid), {})[name] = v
    for key, v in info.pop("scalar_state").items():
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = v
    groups = info.pop("param_groups")
    for g in groups:
        g["betas"] = tuple(g["betas"])
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    return info


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The finished checkpoint (train_state.json present) with the highest step, or None."""
    found = []
    for d in list((out_dir / "checkpoints").glob("step_*")) + [out_dir / "final"]:
        if (d / STATE_JSON).is_file():
            found.append((json.loads((d / STATE_JSON).read_text())["step"], d.name != "final", d))
    return max(found)[2] if found else None


def log_spaced(step: int) -> bool:
    """True at steps 1, 2, 4, 8, ... (powers of two): checkpoints to follow how structure emerges."""
    return step >= 1 and step & (step - 1) == 0


def should_checkpoint(step: int, cfg: PretrainConfig) -> bool:
    return (cfg.ckpt_log_spaced and log_spaced(step)) or (cfg.ckpt_every > 0 and step % cfg.ckpt_every == 0)
