"""`workbench app`: start the Streamlit app (apps/app.py) on a local address.

Runs `python -m streamlit run apps/app.py --server.address HOST --server.port PORT
--server.headless true --browser.gatherUsageStats false -- --results RESULTS` in a child process
(streamlit's own CLI, so its config handling stays the same) and waits for it. The app binds to
127.0.0.1 unless told otherwise, and never phones home.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path


def app_file() -> Path:
    """apps/app.py of the installed `apps` package (found, not imported: the app sits above workbench)."""
    spec = importlib.util.find_spec("apps")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the `apps` package is not installed (pip install plm-workbench)")
    return Path(spec.origin).resolve().parent / "app.py"


def app_command(results: str | Path, host: str = "127.0.0.1", port: int = 8501) -> list[str]:
    """The streamlit command line that serves the app on host:port for the results root `results`."""
    if not 0 < int(port) < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    app = app_file()
    if not app.is_file():
        raise FileNotFoundError(f"the app entry file {app} is missing")
    return [sys.executable, "-m", "streamlit", "run", str(app),
            "--server.address", str(host), "--server.port", str(int(port)),
            "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--", "--results", str(Path(results).resolve())]


def launch_app(results: str | Path = "runs", host: str = "127.0.0.1", port: int = 8501) -> int:
    """Serve the app until interrupted; returns streamlit's exit status.

    A missing results folder is not an error (the app says which command creates runs); it is
    reported so that a typo in --results is visible."""
    cmd = app_command(results, host, port)
    if not Path(results).is_dir():
        print(f"workbench app: {results} does not exist yet; the app will say how to create runs", file=sys.stderr)
    print(f"workbench app: http://{host}:{port} (results: {results})", file=sys.stderr)
    env = {**os.environ, "WORKBENCH_RESULTS": str(Path(results).resolve())}
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0
