#!/bin/sh
# Reproduction v3 (issue 24), in priority order; resumable: a run whose record is in
# docs/results/runs is skipped, an interrupted training resumes from its last checkpoint.
# Run from the repository root after building the data (docs/results/README.md, Commands):
#   nice -n 10 env OMP_NUM_THREADS=1 sh configs/repro_cpu_v3/run.sh
# Two lanes, one per core: lane K takes every second run (--shard K/2) of each step in turn, so
# neither core waits for the other between steps; `sh configs/repro_cpu_v3/run.sh K` runs lane K alone.
set -e
PY=${PY:-.venv/bin/python}
lane() {
  shard="--shard $1/2"
  # 1. The train-length trend with warmup 10% at every length (the 2% of v2 trained L = 128 and 256
  #    worse, docs/results/README.md, v3 pilots): LaTeX then code, seed-major, L = 64, 128, 256;
  #    equal windows at every length (the paper's 320, fewer where the split has fewer); windowed@L.
  $PY tools/run_matrix.py configs/repro_cpu_v3/trend_warmup10/matrix.json --records docs/results/runs $shard \
      --eval-args "--max-windows 320 --batch-size 1 --data-seed 1234" --windowed L --windowed-only kerple_log
  # 2. The same trend with 16 sequences per step at every length (so 2x and 4x the tokens at L = 128
  #    and 256): the trend's equal tokens left the longer lengths worse models on the same text
  #    (trend.md, "Is the model as good at every train length?"); LaTeX, kerple_log and kerple_power_ap_.
  $PY tools/run_matrix.py configs/repro_cpu_v3/trend_16seq/matrix.json --records docs/results/runs $shard \
      --eval-args "--max-windows 320 --batch-size 1 --data-seed 1234" --windowed L --windowed-only kerple_log
  # 2b. A quality-matched point for the 16-sequence trend: L = 64 on 64 sequences per step, i.e. the
  #    8.2M tokens and 4,096 tokens per step of its L = 256 runs (docs/results/README.md, "Equal
  #    tokens, unequal models"); does the L = 64 model's windowed gap shrink as far when it is as good?
  $PY tools/run_matrix.py configs/repro_cpu_v3/l64_64seq/matrix.json --records docs/results/runs $shard \
      --eval-args "--max-windows 320 --batch-size 1 --data-seed 1234" --windowed L --windowed-only kerple_log
  # 2c. Code's equal-sequence trend (kerple_log and its windowed@L): on code only the equal-token trend
  #    ran, where quality and L move together (r = 0.97), so trend.md's gap-against-quality fit cannot
  #    tell them apart there; the equal-sequence design moves quality the other way.
  $PY tools/run_matrix.py configs/repro_cpu_v3/code_16seq/matrix.json --records docs/results/runs $shard \
      --eval-args "--max-windows 320 --batch-size 1 --data-seed 1234" --windowed L --windowed-only kerple_log
  # 2d. Code's quality-matched point: L = 64 on 64 sequences per step, the 8.2M tokens of code_16seq's
  #    L = 256 runs (seeds 1235-1237, paired with them), as 2b is for LaTeX.
  $PY tools/run_matrix.py configs/repro_cpu_v3/code_64seq/matrix.json --records docs/results/runs $shard \
      --eval-args "--max-windows 320 --batch-size 1 --data-seed 1234" --windowed L --windowed-only kerple_log
  # 3. Train length 64 additions, scored as v2's train-length-64 runs they are paired with
  #    (131,072 tokens per length): kerple_power_ap_ seeds 4-5, then T5 with max distance = L.
  for m in l64_power_seeds_4_5 l64_rpe_scaled; do
    $PY tools/run_matrix.py configs/repro_cpu_v3/$m/matrix.json --records docs/results/runs $shard \
        --eval-args "--max-tokens 131072 --batch-size 4 --data-seed 1234"
  done
  # 4. The web explanation, tested (issue 24): web's kerple_log and kerple_power_ap_ retrained as in
  #    v2 (train length 64) and scored on the test split's documents of >= 2,048 tokens only (dataset
  #    web_long: its own group in the report), full and windowed@64, equal windows per length.
  $PY tools/run_matrix.py configs/repro_cpu_v3/web_long_docs/matrix.json --records docs/results/runs $shard \
      --eval-args "--max-windows 320 --batch-size 1 --data-seed 1234 --min-doc-tokens 2048" \
      --windowed L --windowed-only kerple_log
}
if [ -n "${1:-}" ]; then  # `sh run.sh K`: lane K alone (K = 1 or 2), e.g. when a core frees up before the other
  lane "$1"
  exit
fi
lane 1 & first=$!
lane 2
wait $first
