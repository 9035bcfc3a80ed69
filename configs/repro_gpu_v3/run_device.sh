#!/bin/sh
# Issue 24's GPU part in one device call: the paper's 162M model at train length 512 in bf16 on the
# code corpus (configs/repro_gpu_v3/code_162M: kerple_log, kerple_power_ap_, alibi, rotary, T5; 500
# steps, short.yml says why), each evaluated to 32x (16,384) with the paper's 320 windows per length
# (fewer where the test split has fewer), kerple_log also windowed@512 (Fig. 5).
#
# Here, first (CPU, once per checkout; the code corpus as in docs/results/README.md, Commands):
#   .venv/bin/python tools/device_bundle.py --data data/repro_v2/code/code_text_document data/repro_v2/code/tokenizer.json
# The call (the device tool's run): command "sh configs/repro_gpu_v3/run_device.sh", carry [".device"],
# timeout_s 590. After each run the records so far are packed into $OUT/records.tar.gz, so a call cut
# short still returns every finished run; a later call skips those (copy them in first). Back here:
#   tar -xzf FILES_AT/records.tar.gz -C docs/results/runs && .venv/bin/python tools/make_report.py ...
# Runs already in docs/results/runs are skipped; ONLY=alibi (a run_matrix --only text) narrows the call.
# MATRIX, RECORDS and EVAL override the defaults below (a dry run of this script on a tiny CPU matrix).
set -e
. .device/activate.sh
MATRIX=${MATRIX:-configs/repro_gpu_v3/code_162M/matrix.json}
RECORDS=${RECORDS:-docs/results/runs}
EVAL=${EVAL:-"--max-factor 32 --max-windows 320 --batch-size 1 --data-seed 1234"}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt" 2>&1 || true
names=$(python3 -c "import json; print(' '.join(r['name'] for r in json.load(open('$MATRIX'))['runs']))")
i=0
for name in $names; do
  case "$name" in *"${ONLY:-}"*) ;; *) i=$((i + 1)); continue ;; esac
  python3 tools/run_matrix.py "$MATRIX" --index $i --records "$RECORDS" --eval-args "$EVAL" \
      --windowed L --windowed-only kerple_log 2>&1 | tee -a "$OUT/matrix.log"
  run_dir=$(python3 -c "import json; print(json.load(open('$MATRIX'))['runs'][$i]['run_dir'])")
  { echo "== $name"; tail -n 40 "$run_dir/matrix.log"; } >> "$OUT/run_logs.txt" 2>/dev/null || true
  done_runs=$(for n in $names; do if [ -f "$RECORDS/$n/record.json" ]; then echo "$n"; fi; done)
  if [ -n "$done_runs" ]; then (cd "$RECORDS" && tar -czf "$OUT/records.tar.gz" $done_runs); fi
  i=$((i + 1))
done
