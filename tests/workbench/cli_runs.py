"""Running `workbench` in process for the bad-input corpus (tests/workbench/test_cli_bad_*.py):
`refused` checks the one-line error, exit 1 and that no folder was made; `succeeds` checks exit 0."""
from __future__ import annotations

import re
from pathlib import Path

from workbench import cli


def refused(capsys, argv: list[str], expected: str, absent: Path | None = None) -> str:
    """Run `workbench argv`: exit 1, one stderr line `workbench <cmd>: error: ...` matching
    `expected` (a regex), no traceback, and no folder at `absent`."""
    capsys.readouterr()
    status = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 1, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(r"^workbench [\w -]+: error: ", lines[0]) and re.search(expected, lines[0]), lines[0]
    if absent is not None:
        assert not absent.exists(), f"{absent} was made: {sorted(p.name for p in absent.iterdir())}"
    return lines[0]


def succeeds(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert status == 0, err
    return out
