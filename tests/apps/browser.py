"""Drive the real app in headless Chromium: start `streamlit run` on a free local port, load pages
over the Chrome DevTools protocol (CDP) and wait for their Plotly charts.

No new dependency: CDP over `websockets` (a dependency of streamlit itself), the rest is the
standard library. Chromium runs with no network access of its own beyond 127.0.0.1 and a fresh
profile. Used by tests/apps/test_browser.py and benchmarks/bench_app.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from websockets.sync.client import connect

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,1000", "--remote-debugging-port=0"]
# JS: the page's state as one JSON string.
PROBE = """JSON.stringify({
  title: (document.querySelector('h1') || {}).innerText || '',
  plots: document.querySelectorAll('.js-plotly-plot .main-svg').length === 0 ? 0 :
         Array.from(document.querySelectorAll('.js-plotly-plot')).filter(p => p.querySelector('.main-svg')).length,
  exceptions: document.querySelectorAll('[data-testid="stException"]').length,
  notices: Array.from(document.querySelectorAll('[data-testid="stAlert"]')).map(e => e.innerText.trim()),
  nav: Array.from(document.querySelectorAll('[data-testid="stSidebarNav"] a')).map(a => a.innerText.trim()),
  stale: document.querySelectorAll('[data-stale="true"]').length,
  running: !!document.querySelector('[data-testid="stStatusWidget"]') &&
           /Running|Stop/.test(document.querySelector('[data-testid="stStatusWidget"]').innerText),
})"""


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


@contextlib.contextmanager
def streamlit_server(results: Path, timeout: float = 90):
    """Serve apps/app.py headless on 127.0.0.1:<free port>; yields the base URL."""
    from workbench.app_launcher import app_command

    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(app_command(results, "127.0.0.1", port), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "WORKBENCH_RESULTS": str(results)})
    try:
        _wait_http(f"http://127.0.0.1:{port}/_stcore/health", timeout)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


class Browser:
    """A headless Chromium tab driven over CDP: navigate, evaluate JS, wait for a condition."""

    def __init__(self, timeout: float = 60):
        binary = chromium_binary()
        if binary is None:
            raise FileNotFoundError("chromium is not installed (apt-get install -y chromium chromium-driver)")
        self.profile = tempfile.mkdtemp(prefix="wb-chromium-")
        self.proc = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        end = time.time() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.time() > end or self.proc.poll() is not None:
                self.close()
                raise TimeoutError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout, legacy=True)
        self._id = 0

    def call(self, method: str, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"CDP {method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, js: str):
        return self.call("Runtime.evaluate", expression=js, returnByValue=True)["result"].get("value")

    def state(self) -> dict:
        return json.loads(self.evaluate(PROBE))

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def click_nav(self, title: str) -> None:
        """Switch page the way a user does: click the sidebar link titled `title` (the default page's
        link points at the app's root, not at its url path, so links are found by their text)."""
        ok = self.evaluate(f"""(() => {{ const a = Array.from(document.querySelectorAll('[data-testid="stSidebarNav"] a'))
            .find(a => a.innerText.trim().split('\\n').pop().trim() === {json.dumps(title)});
            if (!a) return false; a.click(); return true; }})()""")
        if not ok:
            raise RuntimeError(f"no sidebar link titled {title!r}")

    def wait_page(self, title: str, n_plots: int, timeout: float = 60) -> tuple[float, dict]:
        """Seconds until the page titled `title` shows >= n_plots rendered Plotly charts, no stale
        element and no script running (or an exception block appears); and the last state."""
        start = time.perf_counter()
        while True:
            st = self.state()
            done = st["title"].strip() == title and st["plots"] >= n_plots and not st["stale"] and not st["running"]
            if done or st["exceptions"]:
                return time.perf_counter() - start, st
            if time.perf_counter() - start > timeout:
                raise TimeoutError(f"page {title!r}: {st} after {timeout} s")
            time.sleep(0.05)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()
        self.proc.terminate()
        with contextlib.suppress(Exception):
            self.proc.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)


# (url path, title, plots the page shows on the fixture)
PAGES = [("runs", "Runs and models", 1), ("layers", "Layers", 4), ("heads", "Heads", 5),
         ("pruning", "Pruning", 3), ("causal", "Causal probes", 0), ("pairs", "Minimal pairs", 0),
         ("flow", "Flow", 1), ("interventions", "Interventions", 1), ("compare", "Finetuned vs frozen", 5),
         ("playground", "Playground", 3)]


def visit_all(base_url: str, pages=PAGES, rounds: int = 1, timeout: float = 120) -> list[dict]:
    """Load the first page, then switch through the others by the sidebar, `rounds` times; per
    visit: round, path, title, seconds to figures (round 0 includes the cold start and the caches
    filling; later rounds are warm page switches), and the final state."""
    browser = Browser()
    out = []
    try:
        for r in range(rounds):
            for k, (path, title, n) in enumerate(pages):
                if r == 0 and k == 0:
                    browser.navigate(f"{base_url}/{path}")
                else:
                    browser.click_nav(title)
                secs, st = browser.wait_page(title, n, timeout)
                out.append({"round": r, "path": path, "title": title, "seconds": secs, **st})
    finally:
        browser.close()
    return out


if __name__ == "__main__":  # python -m tests.apps.browser RESULTS_ROOT
    with streamlit_server(Path(sys.argv[1])) as url:
        for row in visit_all(url, rounds=2):
            print(row)
