#!/bin/sh
# `make test-gpu` without make (a bare GPU machine may lack it): docs/gpu.md.
#   sh scripts/test_gpu.sh [--require-cuda] [--only a,b] [--skip c] [--cpu] [--out PATH]
# GPU_PY: the interpreter (default python3); GPU_SITE: where carried wheels go (default /tmp/trinity-gpu-site).
set -e
cd "$(dirname "$0")/.."
PY=${GPU_PY:-python3}
SITE=${GPU_SITE:-/tmp/trinity-gpu-site}
"$PY" -m scripts.gpu_check.wheels install --wheels .whl --target "$SITE"
PYTHONPATH="$SITE:$PWD:$PWD/gen${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 exec "$PY" -m scripts.gpu_check "$@"
