"""The training state of a checkpoint, beside the model (no pickles), and when checkpoints are written.

A checkpoint folder is a `plmodels.save` folder plus `train_state.safetensors` (the optimizer's
tensors) and `train_state.json` (step, tokens, elapsed time, data position, seed, param groups);
the JSON is written last, so a folder without it is an unfinished checkpoint and
`latest_checkpoint` skips it (the pretraining loop also builds each checkpoint folder aside and
renames it in whole, so such a folder comes only from older versions or other writers).
`train_state.json` also holds the sha256 of `train_state.safetensors` and the model's own
checksums.json (plmodels.checkpoint) that of the weights, so a checkpoint torn after it was
renamed in (a copy cut short, a full disk, a file truncated by hand) is recognised:
`latest_checkpoint` skips it, saying why, and the run resumes from the newest good one.
Checkpoints fall every `ckpt_every` steps and, with `ckpt_log_spaced`, at steps 1, 2, 4, 8, ...
(to follow how structure emerges early).
"""
from __future__ import annotations

from pathlib import Path

import torch
from plmodels.checkpoint import (
    WEIGHTS_FILE,
    CheckpointError,
    file_sha256,
    read_json_file,
    read_safetensors,
    verify_checksums,
)
from plmodels.files import save_safetensors, write_json_atomic

from .config import PretrainConfig
from .runtime import log


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
    write_json_atomic(folder / STATE_JSON, {**info, "param_groups": sd["param_groups"], "scalar_state": scalars,
                                            "sha256": {STATE_TENSORS: file_sha256(folder / STATE_TENSORS)}})


def read_state_info(folder: Path) -> dict:
    """train_state.json of a checkpoint folder; a damaged one is a CheckpointError naming it."""
    info = read_json_file(folder / STATE_JSON)
    if not isinstance(info, dict) or not isinstance(info.get("step"), int):
        raise CheckpointError(f"{folder / STATE_JSON}: expected a JSON object with an integer 'step'")
    return info


def check_checkpoint(folder: Path) -> dict:
    """A finished checkpoint folder's train_state.json, after checking every file a resumption
    reads: the weights against checksums.json and the training state against the JSON's sha256
    (a folder from before these existed: each file read whole instead). Damage is a CheckpointError
    naming the file."""
    info = read_state_info(folder)
    verify_checksums(folder)
    want = (info.get("sha256") or {}).get(STATE_TENSORS)
    if want is not None:
        got = file_sha256(folder / STATE_TENSORS) if (folder / STATE_TENSORS).is_file() else "missing"
        if got != want:
            raise CheckpointError(f"{folder / STATE_TENSORS}: sha256 {got[:12]} does not match {STATE_JSON} "
                                  f"({want[:12]}): the file is torn or was changed")
    else:
        read_safetensors(folder / STATE_TENSORS)
    if not (folder / "checksums.json").is_file():
        read_safetensors(folder / WEIGHTS_FILE)
    return info


def load_train_state(folder: Path, optimizer: torch.optim.Optimizer) -> dict:
    """Restore the optimizer from a checkpoint folder; returns the JSON info (step, tokens, ...)."""
    info = read_state_info(folder)
    info.pop("sha256", None)
    tensors = read_safetensors(folder / STATE_TENSORS)
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


def latest_checkpoint(out_dir: Path, quiet: bool = False) -> Path | None:
    """The good finished checkpoint (train_state.json present, every file intact: `check_checkpoint`)
    with the highest step, or None. A damaged one is skipped with a warning naming the file and
    what is wrong (unless `quiet`), so a run resumes from the newest good checkpoint before it."""
    found = []
    for d in list((out_dir / "checkpoints").glob("step_*")) + [out_dir / "final"]:
        if (d / STATE_JSON).is_file():
            try:
                step = read_state_info(d)["step"]
            except CheckpointError as e:
                if not quiet:
                    log(f"warning: skipping the damaged checkpoint {d.name}: {e}")
                continue
            found.append((step, d.name != "final", d))
    for _, _, d in sorted(found, reverse=True):
        try:
            check_checkpoint(d)
        except (CheckpointError, OSError) as e:
            if not quiet:
                log(f"warning: skipping the damaged checkpoint {d.name}: {e}")
            continue
        return d
    return None


def log_spaced(step: int) -> bool:
    """True at steps 1, 2, 4, 8, ... (powers of two): checkpoints to follow how structure emerges."""
    return step >= 1 and step & (step - 1) == 0


def should_checkpoint(step: int, cfg: PretrainConfig) -> bool:
    return (cfg.ckpt_log_spaced and log_spaced(step)) or (cfg.ckpt_every > 0 and step % cfg.ckpt_every == 0)
