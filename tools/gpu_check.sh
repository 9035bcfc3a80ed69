#!/bin/sh
# The whole GPU check in one command (issue 32): sh tools/gpu_check.sh OUT_DIR [--tiny] [--only STEP ...]
# On a lent H100/H200 (the device tool: carry [".device"], command "sh tools/gpu_check.sh $OUT",
# timeout_s 600) it activates the bundle that tools/device_bundle.py packed here, then runs
# tools/gpu_check.py (the steps, their clocks and OUT_DIR's files are described there). Back here:
# python tools/gpu_results.py FILES_AT. --tiny runs the same steps at toy sizes on any machine.
[ $# -ge 1 ] || { echo "usage: sh tools/gpu_check.sh OUT_DIR [--tiny] [--only STEP ...]" >&2; exit 2; }
out=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "gpu_check: cannot use $1 as the results directory" >&2; exit 2; }
shift
cd "$(dirname "$0")/.." || exit 2
if [ -f .device/activate.sh ] && [ -z "${GPU_CHECK_NO_BUNDLE:-}" ]; then
  . .device/activate.sh || { echo "gpu_check: the device bundle did not activate; rebuild it here: python tools/device_bundle.py" >&2; exit 2; }
  PY=python3
else
  PY=${PYTHON:-python3}
fi
exec "$PY" tools/gpu_check.py "$out" "$@"
