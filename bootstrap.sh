#!/usr/bin/env bash
# Set up ooc from a clean clone: a virtual environment in .venv with the CPU build of torch first
# (a plain `torch` requirement would pull a multi-GB CUDA build), then the project and test extras.
# Idempotent: a second run only re-checks the installs.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
fi
.venv/bin/python -m pip install --quiet -e ".[test]"
echo "ooc installed in $(pwd)/.venv (run: .venv/bin/ooc --help)"
