#!/usr/bin/env bash
# Set up ooc from a clean clone: a virtual environment in .venv, torch, then the project and its test
# extras. torch comes from the index pip is configured with: on PyPI (Linux x86-64) that is the CUDA
# build; TORCH_INDEX_URL picks another, e.g. https://download.pytorch.org/whl/cpu for the CPU-only build.
# A .venv that already imports torch keeps it. OOC_EXTRAS picks the extras (default test, which
# includes PyG and OGB so their interop is tested). Idempotent: a second run only re-checks the installs.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    .venv/bin/python -m pip install --quiet --index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"
  else
    .venv/bin/python -m pip install --quiet "$TORCH_SPEC"
  fi
fi
.venv/bin/python -m pip install --quiet -e ".[${OOC_EXTRAS:-test}]"
echo "ooc installed in $(pwd)/.venv with $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)') (run: .venv/bin/ooc --help)"
