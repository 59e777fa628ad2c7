"""workbench.app_launcher: the streamlit command line binds to 127.0.0.1, is headless, sends no
usage statistics and hands the results root to the app."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.common import results_root
from workbench.app_launcher import app_command, app_file

ROOT = Path(__file__).resolve().parents[2]


def _opt(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_default_command(tmp_path):
    cmd = app_command(tmp_path)
    assert cmd[1:4] == ["-m", "streamlit", "run"] and Path(cmd[4]) == app_file() == ROOT / "apps" / "app.py"
    assert _opt(cmd, "--server.address") == "127.0.0.1" and _opt(cmd, "--server.port") == "8501"
    assert _opt(cmd, "--server.headless") == "true" and _opt(cmd, "--browser.gatherUsageStats") == "false"
    assert cmd[cmd.index("--") + 1:] == ["--results", str(tmp_path.resolve())]


def test_host_port_and_bad_port(tmp_path):
    cmd = app_command(tmp_path, host="0.0.0.0", port=9000)
    assert _opt(cmd, "--server.address") == "0.0.0.0" and _opt(cmd, "--server.port") == "9000"
    with pytest.raises(ValueError, match="port"):
        app_command(tmp_path, port=70000)


def test_app_reads_results_from_argv_then_env(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path / "env"))
    monkeypatch.setattr("sys.argv", ["app.py"])
    assert results_root() == tmp_path / "env"
    monkeypatch.setattr("sys.argv", ["app.py", "--results", str(tmp_path / "argv")])
    assert results_root() == tmp_path / "argv"
    monkeypatch.delenv("WORKBENCH_RESULTS")
    monkeypatch.setattr("sys.argv", ["app.py"])
    assert results_root() == Path("runs")
