#!/usr/bin/env bash
# Memory-safe batches on one GPU (issue 34): bench/gpu_suite.py's calibration, plans and drawn steps.
#
#   bench/gpu_suite.sh LENGTHS_DIR [--wheels DIR] [gpu_suite.py options...]
#
# LENGTHS_DIR: <corpus>.npy durations in seconds (a copy of ../shared/data/real-lengths). --wheels DIR:
# wheels to install first, offline (lhotse and its dependencies; webdataset is not needed to plan). Results:
# $OUT/gpu_suite.json and $OUT/gpu_suite.md ($OUT defaults to ./gpu_suite_out). Runs from any directory.
# Budget: well under 8 minutes on one H200 (the suite stops starting plans after --max-minutes, default 7).
set -euo pipefail
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    sed -n '2,9p' "$0" >&2
    exit 2
fi
LENGTHS=$(cd "$1" && pwd)
shift
WHEELS=""
if [ "${1:-}" = "--wheels" ]; then
    WHEELS=$(cd "$2" && pwd)
    shift 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$PWD/gpu_suite_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ -n "$WHEELS" ]; then
    # offline, from the carried wheels only; a failure leaves the suite without lhotse's rows, not stopped
    "$PY" -m pip install --no-index --find-links "$WHEELS" "$WHEELS"/*.whl -q 2>&1 | tail -3 \
        || echo "gpu_suite.sh: installing the wheels failed; lhotse rows will be missing" >&2
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$OUT/numba-cache}
"$PY" - <<'PY' || true
import torch
print(f"torch {torch.__version__}, CUDA {torch.cuda.is_available()}",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
exec "$PY" "$ROOT/bench/gpu_suite.py" --lengths-dir "$LENGTHS" --out "$OUT" "$@"
