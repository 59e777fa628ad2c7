"""The `workbench` command line as a user meets it (workbench/cli.py's docstring is the contract):

- every argument of every subcommand has help, and every option that takes a value shows its default;
- a runtime error is one line on stderr, `workbench <cmd>: error: ...`, exit 1, no traceback unless
  --debug or WORKBENCH_DEBUG=1; a usage error exits 2; Ctrl-C exits 130 with one line; an unexpected
  exception type keeps its traceback;
- a pytorch_model.bin that is more than tensors is refused in one line, and never unpickled.

The subprocess tests run `python -m workbench.cli` (a few seconds each: the subcommand imports torch);
the handler's other branches are tested in-process by calling main() with a subcommand function
replaced.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from plmodels.config import ConfigError
from workbench import cli

REPO = Path(__file__).resolve().parents[2]


def _subparsers(parser: argparse.ArgumentParser, name: str = "workbench"):
    """(name, parser) of `parser` and of every subcommand under it, depth first."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _subparsers(sub, f"{name} {sub_name}")


def test_every_argument_has_help_and_every_option_shows_its_default():
    parsers = dict(_subparsers(cli.build_parser()))
    assert {"workbench probe", "workbench data tasks", "workbench import-hf", "workbench app"} <= set(parsers)
    for name, parser in parsers.items():
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            where = f"{name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and action.help is not argparse.SUPPRESS and action.help.strip(), f"{where}: no help"
            shown = formatter._get_help_string(action) % {**vars(action), "prog": parser.prog}
            if action.option_strings and action.nargs != 0 and not action.required:   # an option with a value
                assert "default" in shown, f"{where}: help does not show the default: {shown!r}"
                if action.default is not None:
                    assert str(action.default) in shown, f"{where}: {shown!r} misses {action.default!r}"
        text = parser.format_help()
        assert "(default: None)" not in text and "==SUPPRESS==" not in text, name
    def help_of(name):   # as printed, lines unwrapped
        return " ".join(parsers[name].format_help().split())

    assert "(default: runs/probe)" in help_of("workbench probe") and "(default: no overrides)" in help_of("workbench probe")
    assert "(default: the config's `methods`: michel,ablation,confidence,l0,random)" in help_of("workbench prune")
    assert "(default: 8501)" in help_of("workbench app")


def test_importing_the_cli_imports_no_library():
    """`workbench --help` stays fast: the subcommands' libraries (and torch) load only when run."""
    code = "import sys, workbench.cli; print(sorted(m for m in ('torch', 'plmodels', 'probes') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_building_the_parser_from_the_analysis_registry_imports_no_library():
    """The analysis subcommands come from the registry's records (cli._analysis_commands), which name
    their config classes by string: the parser is built, every analysis subcommand included, with
    neither torch nor pandas loaded."""
    code = ("import sys, workbench.cli as c; p = c.build_parser(); "
            "print(sorted(m for m in ('torch', 'plmodels', 'probes', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- the error handler, in-process
def _raise(exc: BaseException):
    def fn(a):
        raise exc
    return fn


@pytest.fixture
def no_debug_env(monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)


def test_a_runtime_error_is_one_line_and_exit_1(monkeypatch, capsys, no_debug_env):
    monkeypatch.setattr(cli, "_analysis", _raise(ConfigError("probe.json: unknown key 'bogus'")))
    assert cli.main(["probe", "m"]) == 1
    err = capsys.readouterr().err
    assert err == "workbench probe: error: probe.json: unknown key 'bogus'\n"
    monkeypatch.setattr(cli, "_data_tasks", _raise(FileNotFoundError("no such treebank")))
    assert cli.main(["data", "tasks"]) == 1
    assert capsys.readouterr().err == "workbench data tasks: error: no such treebank\n"


@pytest.mark.parametrize("how", ["--debug before", "--debug after", "env"])
def test_debug_adds_the_traceback(monkeypatch, capsys, no_debug_env, how):
    monkeypatch.setattr(cli, "_analysis", _raise(ValueError("bad heads")))
    argv = {"--debug before": ["--debug", "heads", "m"], "--debug after": ["heads", "m", "--debug"],
            "env": ["heads", "m"]}[how]
    if how == "env":
        monkeypatch.setenv(cli.DEBUG_ENV, "1")
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ValueError: bad heads" in err
    assert err.endswith("workbench heads: error: bad heads\n")


def test_ctrl_c_exits_130_with_one_line(monkeypatch, capsys, no_debug_env):
    monkeypatch.setattr(cli, "_run", _raise(KeyboardInterrupt()))
    assert cli.main(["run", "configs/demo.json"]) == 130
    assert capsys.readouterr().err == "workbench run: interrupted\n"


def test_an_unexpected_exception_keeps_its_traceback(monkeypatch, capsys, no_debug_env):
    monkeypatch.setattr(cli, "_report", _raise(TypeError("unsupported operand")))
    assert cli.main(["report", "runs/x"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.endswith("workbench report: unexpected error: TypeError: unsupported operand\n")


def test_a_subcommand_may_return_its_own_exit_status(monkeypatch):
    monkeypatch.setattr(cli, "_app", lambda a: 3)   # `app` passes streamlit's status on
    assert cli.main(["app"]) == 3
    monkeypatch.setattr(cli, "_report", lambda a: None)
    assert cli.main(["report", "runs/x"]) == 0


def test_a_usage_error_exits_2(capsys):
    for argv in (["probe"], ["probe", "m", "--no-such-option"], ["app", "--port", "eighty"], []):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2, argv
        assert "error:" in capsys.readouterr().err


# --------------------------------------------------------------------------- the real command, in a subprocess
def _workbench(*args: str, cwd: Path, debug: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != cli.DEBUG_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args, *(["--debug"] if debug else [])],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_bad_config_key_is_one_line_exit_1(tmp_path):
    (tmp_path / "probe.json").write_text(json.dumps({"bogus": 1}))
    p = _workbench("probe", "no-such-model", "--config", "probe.json", cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert p.stderr.startswith("workbench probe: error: probe.json: unknown key 'bogus'")


def test_a_missing_model_folder_with_debug_shows_the_traceback(tmp_path):
    p = _workbench("probe", "no-such-model", cwd=tmp_path, debug=True)
    assert p.returncode == 1, p.stderr
    assert "Traceback (most recent call last)" in p.stderr
    assert p.stderr.splitlines()[-1].startswith("workbench probe: error: no-such-model")


def test_a_usage_error_exits_2_in_a_subprocess(tmp_path):
    p = _workbench("probe", "--no-such-option", cwd=tmp_path)
    assert p.returncode == 2 and "usage: workbench probe" in p.stderr and "Traceback" not in p.stderr


class _TouchMarker:
    """A pickle payload that, if ever unpickled, runs a shell command creating a marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def test_import_hf_refuses_a_pickle_with_code_in_one_line(tmp_path):
    src, marker = tmp_path / "hf", tmp_path / "MARKER"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({
        "model_type": "bert", "vocab_size": 40, "hidden_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 4, "intermediate_size": 48, "max_position_embeddings": 24}))
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(40, 32), "payload": _TouchMarker(marker)},
               src / "pytorch_model.bin")
    p = _workbench("import-hf", "hf", "out", cwd=tmp_path)
    assert not marker.exists(), "the pickle was unpickled"
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert p.stderr.startswith("workbench import-hf: error: refused to load hf/pytorch_model.bin")
    assert "model.safetensors" in p.stderr and "arbitrary code" in p.stderr
    assert not (tmp_path / "out").exists()


def test_export_hf_writes_the_folder_and_refuses_in_one_line(tmp_path, capsys, no_debug_env):
    """In-process (the real export, tiny models): a GPT-2-computable decoder is written; an ALiBi one
    (no transformers class computes it) is refused in one line naming the field, and nothing is written."""
    from plmodels import Decoder, DecoderConfig, save

    sizes = dict(vocab_size=61, d_model=16, n_layers=1, n_heads=2, d_ff=24, max_positions=8)
    save(Decoder(DecoderConfig(**sizes)), None, tmp_path / "gpt")
    assert cli.main(["export-hf", str(tmp_path / "gpt"), str(tmp_path / "hf")]) == 0
    assert capsys.readouterr().out.startswith("exported ")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "gpt2"
    save(Decoder(DecoderConfig(**sizes, position="alibi")), None, tmp_path / "alibi")
    assert cli.main(["export-hf", str(tmp_path / "alibi"), str(tmp_path / "hf-alibi")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("workbench export-hf: error: ") and err.count("\n") == 1
    assert "position='alibi'" in err
    assert not (tmp_path / "hf-alibi").exists()
