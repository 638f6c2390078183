#!/usr/bin/env bash
# The checks a lent GPU machine is for, in one call (its device time is short),
# those that need the machine alone first:
#   1. jdtr.grad's step times against jax.jit(jax.grad) on the GPU
#      (`grad_benchmark.py`), then
#   2. where the host spends a compiled call (`host_profile.py`: cProfile
#      of calls once they run as chunks), then
#   3. the cap on a chunk's computations side by side (`chunk_cost.py`:
#      chunks, arrays crossing, host and step times): on the CPU the cap
#      makes steps faster; whether it does on a GPU is this measurement, then
#   4. a plan's chunks against its step as one program (`whole_step.py`:
#      "always", "whole" and the default's choice between them by timing,
#      side by side; on the CPU neither was faster on every model, and on a
#      GPU a chunk costs the host more), then
#   5. the test suite on the machine's JAX (0.11 there, which CI cannot
#      install), on its CPU backend, beside
#   6. allocator peaks of jdtr.grad's steps on the GPU (`device_peak.py`:
#      memory only, so the tests beside it change nothing; 5 calls a process,
#      so that the margin a plan learns from the allocator shows), then
#   7. the device's allocator against jdtr's model of it, dispatch by
#      dispatch (`allocator_trace.py`, memory only: its record comes back as
#      traces.jsonl, to compare the model with without a device).
# Each part has its own time limit, 530 s in all by default: with a machine's
# start (about 35 s), one call fits a 15-minute lease. What it printed comes
# back under $OUT even when it is cut short (the benchmarks print each row as
# it is made), in eight files (the most the device tool brings back): the
# one-program rows follow the chunk cap's in caps.txt. (`slack_benchmark.py
# --slacks`, what a chunk is worth, ran here before: SLACK_S=60 runs it after them.)
#
#   bash benchmarks/gpu_check.sh            # in the device tool's `run`, timeout_s=550
#   TIMES_S=180 PROFILE_S=60 CAPS_S=240 WHOLE_S=180 SUITE_S=270 PEAKS_S=240 bash benchmarks/gpu_check.sh
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # jdtr from this checkout (not installed there)
PY=${PY:-python3}
TIMES_S=${TIMES_S:-140}
PROFILE_S=${PROFILE_S:-45}
CAPS_S=${CAPS_S:-70}
WHOLE_S=${WHOLE_S:-60}
SLACK_S=${SLACK_S:-0}
SUITE_S=${SUITE_S:-185}
PEAKS_S=${PEAKS_S:-150}
TRACE_S=${TRACE_S:-60}
SUITE_ARGS=${SUITE_ARGS:-tests --ignore=tests/test_notebooks.py}

{
  date -u
  nvidia-smi -L
  $PY -c "import jax, flax, optax, numpy, scipy; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'numpy', numpy.__version__, 'scipy', scipy.__version__); print(jax.devices())"
} > "$OUT/env.txt" 2>&1

# 1. Step times, alone.
timeout "$TIMES_S" $PY benchmarks/grad_benchmark.py --only models --repeats 5 ${TIMES_ARGS:---ratios 1.0 0.5} > "$OUT/times.txt" 2>&1
echo "grad_benchmark exit $?" >> "$OUT/times.txt"

# 2. Where the host spends a call, alone.
timeout "$PROFILE_S" $PY benchmarks/host_profile.py --models transformer --ratios 1.0 0.5 --calls 20 > "$OUT/profile.txt" 2>&1
echo "host_profile exit $?" >> "$OUT/profile.txt"

# 3. The cap on a chunk's computations, side by side, alone.
timeout "$CAPS_S" $PY benchmarks/chunk_cost.py --models transformer resnet --ratios 1.0 0.5 --caps 512 0 --repeats 15 > "$OUT/caps.txt" 2>&1
echo "chunk_cost exit $?" >> "$OUT/caps.txt"

# 4. Chunks against one program, side by side, alone (then, where SLACK_S is set, what a chunk is worth).
timeout "$WHOLE_S" $PY benchmarks/whole_step.py --models ${WHOLE_MODELS:-transformer mlp} --ratios 0.5 --repeats 7 >> "$OUT/caps.txt" 2>&1
echo "whole_step exit $?" >> "$OUT/caps.txt"
if [ "$SLACK_S" -gt 0 ]; then
  timeout "$SLACK_S" $PY benchmarks/slack_benchmark.py --models transformer --ratios 0.5 --slacks 0.1 0.2 0.3 >> "$OUT/caps.txt" 2>&1
  echo "slack_benchmark exit $?" >> "$OUT/caps.txt"
fi

# 5. The suite on the CPU backend; SIGINT at the limit makes pytest print what failed so far.
JAX_PLATFORMS=cpu timeout -s INT "$SUITE_S" $PY -m pytest -p no:cacheprovider -p no:benchmark -n "${SUITE_WORKERS:-12}" -v --tb=short -rf \
  --durations=20 $SUITE_ARGS > "$OUT/suite.log" 2>&1 &
suite=$!

# 6. Allocator peaks (three processes side by side, each with its share of the device).
timeout "$PEAKS_S" $PY benchmarks/device_peak.py --only eager --jobs 3 --calls "${PEAK_CALLS:-5}" ${PEAKS_ARGS:---models MLP+64 Transformer ResNet --eager-ratios 1.0 0.5 0.3} > "$OUT/peaks.txt" 2>&1
echo "device_peak exit $?" >> "$OUT/peaks.txt"

# 7. The allocator against its model (beside the suite too: memory only).
timeout "$TRACE_S" $PY benchmarks/allocator_trace.py --out "$OUT/traces.jsonl" 2>&1 | grep -v Warning > "$OUT/traces.txt"

wait $suite
echo "suite exit $?" >> "$OUT/suite.log"

tail -n 20 "$OUT/times.txt"
grep -E "^##|exit" "$OUT/profile.txt"
grep -E "^\||exit" "$OUT/caps.txt" | tail -n 25
grep -E "^\(|exit" "$OUT/peaks.txt" | tail -n 30
cat "$OUT/traces.txt"
grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | head -n 60
tail -n 3 "$OUT/suite.log"
