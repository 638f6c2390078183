#!/usr/bin/env bash
# The checks a lent GPU machine is for, in one call (its device time is short):
#   1. the test suite on the machine's JAX (0.11 there, which CI cannot
#      install), on its CPU backend, beside
#   2. allocator peaks of jdtr.grad's steps on the GPU (`device_peak.py`:
#      memory only, so the tests beside it change nothing; 6 calls a process,
#      so that the margin a plan learns from the allocator shows), then
#   3. jdtr.grad's step times against jax.jit(jax.grad) on the GPU
#      (`grad_benchmark.py`), alone on the machine, then
#   4. the slack side by side (`slack_benchmark.py`: plans at the budget
#      and a little under it, run as chunks), alone, then
#   5. the cap on a chunk's computations side by side (`chunk_cost.py`:
#      chunks, arrays crossing, host and step times), alone: on the CPU the
#      cap makes steps faster; whether it does on a GPU is this measurement.
# Each part has its own time limit; what it printed comes back under $OUT
# even when it is cut short (the benchmarks print each row as it is made).
#
#   bash benchmarks/gpu_check.sh            # in the device tool's `run`
#   SUITE_S=270 PEAKS_S=240 TIMES_S=180 SLACK_S=120 CAPS_S=240 bash benchmarks/gpu_check.sh
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # jdtr from this checkout (not installed there)
PY=${PY:-python3}
SUITE_S=${SUITE_S:-270}
PEAKS_S=${PEAKS_S:-240}
TIMES_S=${TIMES_S:-180}
SLACK_S=${SLACK_S:-120}
CAPS_S=${CAPS_S:-240}
SUITE_ARGS=${SUITE_ARGS:-tests --ignore=tests/test_notebooks.py}

{
  date -u
  nvidia-smi -L
  $PY -c "import jax, flax, optax, numpy, scipy; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'numpy', numpy.__version__, 'scipy', scipy.__version__); print(jax.devices())"
} > "$OUT/env.txt" 2>&1

# 1. The suite on the CPU backend; SIGINT at the limit makes pytest print what failed so far.
JAX_PLATFORMS=cpu timeout -s INT "$SUITE_S" $PY -m pytest -p no:cacheprovider -p no:benchmark -n "${SUITE_WORKERS:-12}" -v --tb=short -rf \
  --durations=20 $SUITE_ARGS > "$OUT/suite.log" 2>&1 &
suite=$!

# 2. Allocator peaks (three processes side by side, each with its share of the device).
timeout "$PEAKS_S" $PY benchmarks/device_peak.py --only eager --jobs 3 --calls "${PEAK_CALLS:-6}" ${PEAKS_ARGS:-} > "$OUT/peaks.md" 2> "$OUT/peaks.err"
echo "device_peak exit $?" >> "$OUT/peaks.err"

wait $suite
echo "suite exit $?" >> "$OUT/suite.log"

# 3. Step times, alone.
timeout "$TIMES_S" $PY benchmarks/grad_benchmark.py --only models --repeats 5 ${TIMES_ARGS:-} > "$OUT/times.md" 2> "$OUT/times.err"
echo "grad_benchmark exit $?" >> "$OUT/times.err"

# 4. The slack, side by side, alone.
timeout "$SLACK_S" $PY benchmarks/slack_benchmark.py --models mlp transformer --ratios 0.5 > "$OUT/slack.md" 2> "$OUT/slack.err"
echo "slack_benchmark exit $?" >> "$OUT/slack.err"

# 5. The cap on a chunk's computations, side by side, alone.
timeout "$CAPS_S" $PY benchmarks/chunk_cost.py --models transformer resnet mlp flax_gpt --ratios 1.0 0.5 --caps 512 4096 --repeats 21 > "$OUT/caps.md" 2> "$OUT/caps.err"
echo "chunk_cost exit $?" >> "$OUT/caps.err"

tail -n 25 "$OUT/suite.log"
grep -c PASSED "$OUT/suite.log"
grep -E "^\(|exit" "$OUT/peaks.err" | tail -n 30
tail -n 20 "$OUT/times.err"
tail -n 8 "$OUT/slack.err"
grep -E "^\||exit" "$OUT/caps.err" | tail -n 25
