#!/usr/bin/env bash
# GPU check of data-parallel training: NCCL DDP over the visible GPUs and the device feature cache (pinned memory,
# non-blocking copies); prints throughput and cache hit ratios. Fails clearly without a GPU.
#   tools/gpu_check.sh [--workdir DIR] [--nodes N] [--feat-dim D] [--batch-size B] [--allow-cpu]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" -m ooc.tools.gpu_check "$@"
