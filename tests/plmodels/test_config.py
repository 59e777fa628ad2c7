"""plmodels.config, the typed loader every config goes through: unknown keys and wrong types are
errors naming the source and the field, nothing is coerced but int -> float and list -> tuple, the
class' own checks still run, and --set values parse into one nested dict."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

import pytest

from plmodels import recipes
from plmodels.config import Config, ConfigError, merge, parse_overrides, read_json
from plmodels.training import load_config


@dataclass(frozen=True)
class Toy(Config):
    lr: float = 1e-3
    steps: int = 10
    name: str = "toy"
    seeds: tuple[int, ...] = (0,)
    mode: Literal["a", "b"] = "a"
    cap: int | None = None
    model: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"Toy.steps must be >= 1, got {self.steps}")


def test_valid_values_build_the_config_with_json_conversions():
    cfg = Toy.from_dict({"lr": 1, "seeds": [1, 2], "cap": None, "model": {"n_heads": 8}})
    assert cfg == Toy(lr=1.0, seeds=(1, 2), model={"n_heads": 8})
    assert isinstance(cfg.lr, float)
    assert Toy.from_dict(cfg.to_dict()) == cfg and cfg.to_dict()["seeds"] == [1, 2]


@pytest.mark.parametrize("bad, message", [
    ({"lr": "1e-3"}, 'lr: input should be a valid number, got "1e-3"'),
    ({"steps": 2.5}, "steps: input should be a valid integer, got 2.5"),
    ({"steps": True}, "steps: input should be a valid integer, got true"),
    ({"name": 3}, "name: input should be a valid string, got 3"),
    ({"seeds": 3}, "seeds: input should be a valid array, got 3"),
    ({"mode": "c"}, "mode: input should be 'a' or 'b'"),
    ({"stepz": 3}, "unknown key 'stepz' (known: lr, steps, name, seeds, mode, cap, model)"),
    ({"steps": 0}, "Toy.steps must be >= 1, got 0"),
])
def test_errors_name_the_source_and_the_field(bad, message):
    with pytest.raises(ConfigError) as e:
        Toy.from_dict(bad, "configs/toy.json")
    assert str(e.value).startswith("configs/toy.json: ") and message in str(e.value)


def test_several_errors_are_listed_together():
    with pytest.raises(ConfigError) as e:
        Toy.from_dict({"lr": "x", "steps": "y"}, "f.json")
    assert "lr:" in str(e.value) and "steps:" in str(e.value)


def test_files_name_their_line_and_a_bom_is_accepted(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"lr": 0.1,\n "steps": }')
    with pytest.raises(ConfigError, match=r"c\.json: invalid JSON at line 2"):
        Toy.load(p)
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"steps": 3}).encode())
    assert Toy.load(p, overrides={"lr": 0.5}) == Toy(steps=3, lr=0.5)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        read_json(tmp_path / "missing.json")


def test_resolve_takes_none_a_dict_a_path_or_a_config():
    assert Toy.resolve() == Toy()
    assert Toy.resolve(None, {"steps": 4}) == Toy(steps=4)
    assert Toy.resolve({"lr": 0.2}, {"steps": 4}) == Toy(lr=0.2, steps=4)
    assert Toy.resolve(Toy(steps=2), {"model": {"a": 1}}) == Toy(steps=2, model={"a": 1})


def test_set_values_parse_dotted_keys_json_values_and_objects():
    got = parse_overrides(["model.n_heads=8", "lr=1e-3", "name=enc-2", 'tasks=["pos"]', '{"model": {"norm": "pre"}}',
                           "cap=null", "flag=true"])
    assert got == {"model": {"n_heads": 8, "norm": "pre"}, "lr": 1e-3, "name": "enc-2", "tasks": ["pos"],
                   "cap": None, "flag": True}
    assert parse_overrides(["lr=1", "lr=2"]) == {"lr": 2}   # later values win
    for bad in ("lr", "=3", "model..x=1", "{not json"):
        with pytest.raises(ConfigError, match="--set"):
            parse_overrides([bad])


def test_merge_is_deep_for_nested_dicts_only():
    base = {"model": {"a": 1, "b": 2}, "seeds": [0, 1], "lr": 1}
    assert merge(base, {"model": {"b": 3}, "seeds": [5]}) == {"model": {"a": 1, "b": 3}, "seeds": [5], "lr": 1}
    assert base["model"] == {"a": 1, "b": 2}   # the input is not changed


def test_recipes_are_found_by_name_by_their_old_path_and_not_by_a_typo(tmp_path):
    assert recipes.find("pretrain", "encoder-tiny") == recipes.RECIPES / "pretrain" / "encoder-tiny.json"
    assert recipes.find("pretrain", "configs/pretrain/encoder-tiny.json") == recipes.find("pretrain", "encoder-tiny")
    assert load_config("configs/pretrain/encoder-mini-cram-fp32.json") == load_config("encoder-mini-cram-fp32")
    mine = tmp_path / "encoder-tiny.json"   # a file of the user's own wins over the recipe of that name
    mine.write_text(json.dumps({"extends": "encoder-tiny", "max_steps": 7}))
    assert load_config(mine).max_steps == 7
    assert "sst2-full" in recipes.names("finetune")
    with pytest.raises(FileNotFoundError, match="no pretrain recipe named 'encoder-tiyn'.*encoder-tiny"):
        recipes.find("pretrain", "encoder-tiyn")
