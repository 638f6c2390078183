"""Real device memory of jdtr steps, from the allocator (GPU/TPU).

jdtr keeps its own count of the bytes it holds (`jdtr.grad`) and plans
against XLA's `memory_analysis()` (`jdtr.remat_grad`); this script checks
both against the device's own allocator:
`device.memory_stats()["peak_bytes_in_use"]` while a step runs, against the
budget. The allocator reports the peak since the process started and cannot
be reset, so every (model, budget) runs in a fresh process, which first
places the arguments, then plans or runs.

Compiling on a GPU autotunes kernels in scratch buffers taken from the same
allocator, which would add to the peak of whatever happens to be live at
that moment. Each measurement therefore runs twice, in two processes that
share a persistent compilation cache: the first compiles (and is
discarded), the second loads the compiled executables and is measured —
the steady state of a training loop.

- `jdtr.grad` (eager): the step under the budget. jdtr counts its buffers
  and XLA's temporaries; the allocator's peak also shows its rounding of
  buffers up to blocks, which jdtr reads back where the device reports it.
- `jdtr.remat_grad`, `autotune=False`: planning only compiles, so the peak
  is the step's own (plus the arguments, which the budget includes).
- `jdtr.remat_grad`, default (autotuned): planning also runs every
  candidate plan within the budget, so the peak is the largest of them and
  the step.

On the CPU `memory_stats()` is None and the script says so and stops.

    python benchmarks/device_peak.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

REMAT_MODELS = {
    "MLP chain, 64 layers, width 256, batch 2048": ("mlp_chain", (64, 256, 2048)),
    "Transformer, 6 blocks, dim 128, seq 128, batch 8": ("transformer", (6, 128, 4, 128, 8, 256)),
}
# grad_benchmark.py's models, and one of a size that fills more of a GPU.
EAGER_MODELS = {
    "MLP chain, 64 layers, width 256, batch 2048": ("mlp_chain", (64, 256, 2048)),
    "ResNet, 4 blocks, 32 channels, 32x32, batch 16": ("resnet", (4, 32, 32, 16)),
    "Transformer, 4 blocks, dim 128, seq 128, batch 8": ("transformer", (4, 128, 4, 128, 8, 256)),
    "RNN, 64 steps, hidden 256, batch 256": ("rnn", (64, 256, 64, 256)),
    "MLP chain, 32 layers, width 2048, batch 16384": ("mlp_chain", (32, 2048, 16384)),
}


def _model(table: dict, name: str):
    import jax

    from jdtr import models

    factory, shape = table[name]
    device = jax.devices()[0]
    before = device.memory_stats()["bytes_in_use"]  # the factory makes the arguments on the device
    m = getattr(models, factory)(*shape)
    params, batch = jax.device_put((m.params, m.batch))
    jax.block_until_ready((params, batch))
    return m, params, batch, device, before


def measure_remat(model: str, ratio: float | None, autotune: bool) -> dict:
    """One planned step in this process: the allocator's peak and XLA's numbers."""
    import jax

    import jdtr

    m, params, batch, device, before = _model(REMAT_MODELS, model)
    arguments = device.memory_stats()["bytes_in_use"] - before
    if ratio is None:
        step, budget, xla = jax.jit(jax.grad(m.loss)), None, None
    else:
        plan = jdtr.plan(m.loss, params, batch, budget=ratio, autotune=autotune)
        step, budget, xla = jax.jit(plan.grad), plan.budget_bytes, plan.compiled_bytes
    jax.block_until_ready(step(params, batch))
    stats = device.memory_stats()
    return {"peak": stats["peak_bytes_in_use"] - before, "arguments": arguments, "budget": budget, "xla": xla}


def measure_eager(model: str, ratio: float | None, heuristic: str, plain: bool = False) -> dict:
    """One `jdtr.grad` step (or eager `jax.grad` for ratio None) in this process.

    `plain`: jdtr as it was before it reserved XLA's workspaces and read the
    allocator's own count (the *before* rows)."""
    import jax

    import jdtr

    if plain:
        import jdtr.transform.gradients as grad

        grad.assign_workspaces = lambda program: None
        grad._device_bytes = lambda inputs, held: None

    m, params, batch, device, before = _model(EAGER_MODELS, model)
    arguments = device.memory_stats()["bytes_in_use"] - before
    result = {"arguments": arguments, "budget": None, "accounted": None, "error": None}
    try:
        if ratio is None:
            grads = jax.grad(m.loss)(params, batch)
        else:
            grads, stats = jdtr.grad(m.loss, budget=ratio, heuristic=heuristic, return_stats=True)(params, batch)
            result.update(budget=stats.budget_bytes, accounted=stats.peak_bytes, evictions=stats.evictions,
                          remats=stats.rematerializations, overhead=stats.overhead)
        jax.block_until_ready(grads)
        outputs = sum(x.nbytes for x in jax.tree_util.tree_leaves(grads))
        del grads
    except jdtr.OutOfBudgetError as err:
        result["error"] = str(err).splitlines()[0]
        outputs = 0
    stats = device.memory_stats()
    # What is left besides the arguments once the gradients are dropped: a leak if not 0.
    result.update(peak=stats["peak_bytes_in_use"] - before, outputs=outputs,
                  left=stats["bytes_in_use"] - before - arguments)
    return result


JOBS = 1  # measurements run side by side (`--jobs`)


def run_child(*child: str, cache: str) -> dict:
    """Runs one measurement twice in fresh processes; returns the second (compiled executables from the cache)."""
    command = [sys.executable, __file__, "--child", *child]
    env = {**os.environ, "JDTR_DEVICE_PEAK_CACHE": cache}
    if JOBS > 1:
        # Processes side by side cannot each take 75% of the device up front;
        # each preallocates its share instead (allocating on demand changes
        # the allocator's peaks: a region grown for one buffer counts whole).
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.9 / JOBS:.3f}"
    for _ in range(2):
        out = subprocess.run(command, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"device_peak: {' '.join(child)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_main(kind: str, model: str, ratio: str, option: str) -> None:
    import jax

    cache = os.environ.get("JDTR_DEVICE_PEAK_CACHE")
    if cache:
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    r = None if ratio == "None" else float(ratio)
    if kind == "remat":
        print(json.dumps(measure_remat(model, r, option == "True")))
    else:
        heuristic, _, variant = option.partition("+")
        print(json.dumps(measure_eager(model, r, heuristic, plain=variant == "plain")))


MIB = 2**20


def eager_table(ratios, heuristic, cache, before=False) -> list[str]:
    lines = [
        f"**jdtr.grad** (eager, heuristic `{heuristic}`): peak = allocator peak above what the process held before the "
        "arguments; jdtr = the runtime's own peak count; left = bytes still in use after the gradients are dropped, "
        "besides the arguments (a leak if not 0)."
        + (" Rows marked *before* run jdtr as it was before it reserved XLA's workspaces and evicted by the "
           "allocator's own count." if before else ""), "",
        "| model | budget | budget MiB | jdtr MiB | peak MiB | peak / budget | evictions | left |",
        "|---|---|---|---|---|---|---|---|",
    ]
    variants = ["", "+plain"] if before else [""]
    jobs = [(model, None, "") for model in EAGER_MODELS]
    jobs += [(model, ratio, v) for model in EAGER_MODELS for ratio in ratios for v in variants]
    results = _run_all([("eager", model, str(ratio), heuristic + v) for model, ratio, v in jobs], cache)
    rows: dict = {}
    for (model, ratio, variant), r in zip(jobs, results):
        label = f"{ratio}" + (" *before*" if variant else "")
        if ratio is None:
            row = f"| {model} | eager jax.grad |  |  | {r['peak'] / MIB:.1f} |  |  | {r['left']} |"
        elif r["error"]:
            row = f"| {model} | {label} | out of budget |  | {r['peak'] / MIB:.1f} |  |  | {r['left']} |"
        else:
            row = (
                f"| {model} | {label} | {r['budget'] / MIB:.1f} | {r['accounted'] / MIB:.1f} | {r['peak'] / MIB:.1f} | "
                f"{r['peak'] / r['budget']:.3f} | {r['evictions']} | {r['left']} |"
            )
        rows.setdefault(model, []).append(row)
    for model in EAGER_MODELS:
        lines += rows[model]
    return lines


def _run_all(children: list, cache: str) -> list[dict]:
    """Each child measured (twice, see `run_child`), `JOBS` at a time, in order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        futures = [pool.submit(run_child, *child, cache=cache) for child in children]
        results = []
        for child, future in zip(children, futures):
            results.append(future.result())
            print(child, {k: v for k, v in results[-1].items() if k != "error"}, file=sys.stderr)
        return results


def remat_table(ratios, cache) -> list[str]:
    lines = [
        "**jdtr.remat_grad**: peak = allocator peak above what the process held before the arguments "
        "(arguments placed, planned, one step); XLA = the plan's `memory_analysis()` bytes.", "",
        "| model | budget | autotune | budget MiB | XLA MiB | peak MiB | peak / budget |", "|---|---|---|---|---|---|---|",
    ]
    jobs = [(model, None, False) for model in REMAT_MODELS]
    jobs += [(model, ratio, autotune) for model in REMAT_MODELS for ratio in ratios for autotune in (False, True)]
    results = _run_all([("remat", model, str(ratio), str(autotune)) for model, ratio, autotune in jobs], cache)
    for (model, ratio, autotune), r in zip(jobs, results):
        if ratio is None:
            lines.append(f"| {model} | jax.jit(jax.grad), no remat |  |  |  | {r['peak'] / MIB:.1f} |  |")
        else:
            lines.append(
                f"| {model} | {ratio} | {'default' if autotune else 'False'} | {r['budget'] / MIB:.1f} | "
                f"{r['xla'] / MIB:.1f} | {r['peak'] / MIB:.1f} | {r['peak'] / r['budget']:.3f} |"
            )
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.7, 0.5, 0.35], help="remat_grad budgets")
    parser.add_argument("--eager-ratios", type=float, nargs="+", default=[1.0, 0.5, 0.3], help="jdtr.grad budgets")
    parser.add_argument("--heuristic", default="lookahead", help="jdtr.grad's heuristic")
    parser.add_argument("--only", choices=["eager", "remat"], help="one of the two tables")
    parser.add_argument("--jobs", type=int, default=1, help="measurements side by side (each process preallocates its share of the device)")
    parser.add_argument("--before", action="store_true", help="also run jdtr.grad as before it reserved workspaces and read the allocator")
    parser.add_argument("--output")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global JOBS
    JOBS = max(1, args.jobs)
    if args.child:
        child_main(*args.child)
        return 0

    import jax

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from grad_benchmark import machine, write_report

    if jax.devices()[0].memory_stats() is None:
        print(f"device_peak: {jax.devices()[0].platform} reports no memory_stats(); run this on a GPU or TPU", file=sys.stderr)
        return 1
    lines = [
        f"### Allocator peaks, {datetime.date.today().isoformat()}", "",
        f"Machine: {machine()}. Peak = `memory_stats()['peak_bytes_in_use']` in a fresh process whose compiled "
        "executables come from a persistent cache filled by an identical process just before (so compile-time "
        f"autotuning scratch is not counted); {JOBS} measurement(s) side by side"
        + (", each preallocating its share of the device (`XLA_PYTHON_CLIENT_MEM_FRACTION`)" if JOBS > 1 else "") + ".", "",
    ]
    with tempfile.TemporaryDirectory() as cache:
        if args.only != "remat":
            lines += eager_table(args.eager_ratios, args.heuristic, cache, args.before) + [""]
        if args.only != "eager":
            lines += remat_table(args.ratios, cache) + [""]
    text = "\n".join(lines)
    print(text)
    write_report(args.output, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
