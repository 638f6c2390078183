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

- `jdtr.grad`: three calls (`--calls`), as a training loop's first steps:
  the first plans and runs step by step, the second compiles the plan's
  chunks, the third runs them (the steady state). Each call's own reading
  of the allocator (`Stats.allocator_peak_bytes`, a plan's first runs) is
  reported too: with more calls, whether the margin it learns keeps the
  budget (`transform/allocator.py`). jdtr counts its buffers and XLA's
  temporaries (a chunk's from its `memory_analysis()`); the allocator's peak
  also shows its rounding of buffers up to blocks, which jdtr reads back
  where the device reports it. The peak of the first call and of all three
  are reported.
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


def measure_eager(model: str, ratio: float | None, heuristic: str, variant: str = "") -> dict:
    """Three `jdtr.grad` steps (or one of eager `jax.grad` for ratio None) in this process.

    `variant` (`--variants`, to find where the allocator's bytes go): "serial"
    waits for each dispatch before the next (frees then land after the
    operations that read them); "online" runs the paper's algorithm, which
    also evicts by the allocator's own count; "noslack" runs the plan made at
    the budget as chunks, never one made for a little less (`slack.py`);
    "noforesight" plans the first call by count alone, as before the
    allocator's model (`allocator.FORESIGHTS`)."""
    import jax

    import jdtr
    from jdtr.transform import rental

    rental.COMPILE_RATE = rental.CompileRate(0.0, weight=None)  # chunks from a plan's second run, as these tables measure (rental_benchmark.py: the rule)
    mode = {}
    if variant == "serial":
        import jdtr.transform.gradients as gradients

        gradients.serial_dispatch = lambda program: True
    elif variant == "online":
        mode = {"mode": "online"}
    elif variant == "noslack":
        import jdtr.transform.slack as slack

        slack.SLACKS = ()
    elif variant == "noforesight":
        import jdtr.transform.allocator as allocator

        allocator.FORESIGHTS = 0

    m, params, batch, device, before = _model(EAGER_MODELS, model)
    arguments = device.memory_stats()["bytes_in_use"] - before
    result = {"arguments": arguments, "budget": None, "accounted": None, "error": None, "first": None}
    try:
        if ratio is None:
            grads = jax.grad(m.loss)(params, batch)
        else:
            kwargs = ({} if heuristic == "default" else {"heuristic": heuristic}) | mode
            step = jdtr.grad(m.loss, budget=ratio, return_stats=True, **kwargs)
            read = []  # what jdtr read of the allocator, per call (None: not read)
            for call in range(CALLS):  # plans and runs step by step; compiles the chunks; runs them; ...
                grads, stats = step(params, batch)
                jax.block_until_ready(grads)
                read.append(stats.allocator_peak_bytes)
                if call == 0:
                    result["first"] = device.memory_stats()["peak_bytes_in_use"] - before
                    result.update(evictions=stats.evictions, steps=stats.chunks, heuristic=stats.heuristic)
                    # The allocator's model's peak (`offline.bfc`) for each plan the first call made, in
                    # order: the one at the budget, then any made for less (the last one ran).
                    from jdtr.offline.bfc import allocator_peak

                    plans = next(iter(step.cache.values())).plans.values()
                    result["modelled"] = [(p.result.budget_bytes, allocator_peak(p.line)) for p in plans]
                if call < CALLS - 1:
                    del grads
            result["read"] = read
            result.update(budget=stats.budget_bytes, accounted=stats.peak_bytes, chunks=stats.chunks)
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
CALLS = 3  # jdtr.grad calls per process (`--calls`)


def run_child(*child: str, cache: str) -> dict:
    """Runs one measurement twice in fresh processes; returns the second (compiled executables from the cache)."""
    command = [sys.executable, __file__, "--calls", str(CALLS), "--child", *child]
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
        print(json.dumps(measure_eager(model, r, heuristic, variant)))


MIB = 2**20


def eager_table(ratios, heuristic, cache, variants=("planned",), models=None) -> list[str]:
    lines = [
        f"**jdtr.grad** (heuristic `{heuristic}`, three calls: planned and run step by step, chunks compiled, chunks "
        "run): peak = allocator peak above what the process held before the arguments, after the first call and after "
        "all three; jdtr = the runtime's own peak count (the third call's); steps = dispatches of the first call / of "
        "the compiled third; left = bytes still in use after the gradients are dropped, besides the arguments (a leak "
        "if not 0)."
        + (" Variants: *serial* waits for each dispatch before the next; *online* is `mode=\"online\"`, which "
           "also evicts by the allocator's count; *noslack* runs the plan made at the budget as chunks." if variants != ("planned",) else ""), "",
        "| model | budget | budget MiB | jdtr MiB | first call's peak MiB | peak MiB | first / budget | peak / budget | heuristic | steps | left | read by jdtr / budget, per call |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    chosen = [m for m in EAGER_MODELS if not models or any(all(w in m for w in spec.split("+")) for spec in models)]
    jobs = [(model, None, "") for model in chosen]
    jobs += [(model, ratio, v) for model in chosen for ratio in ratios for v in variants]
    results = _run_all([("eager", model, str(ratio), f"{heuristic}+{v}") for model, ratio, v in jobs], cache)
    rows: dict = {}
    for (model, r_, variant), r in zip(jobs, results):
        ratio = f"{r_} *{variant}*" if variant not in ("", "planned") else r_
        if ratio is None:
            row = f"| {model} | eager jax.grad |  |  |  | {r['peak'] / MIB:.1f} |  |  |  |  | {r['left']} | |"
        elif r["error"]:
            row = f"| {model} | {ratio} | out of budget |  |  | {r['peak'] / MIB:.1f} |  |  |  |  | {r['left']} | |"
        else:
            read = ", ".join("-" if x is None else f"{x / r['budget']:.3f}" for x in r.get("read", ()))
            row = (
                f"| {model} | {ratio} | {r['budget'] / MIB:.1f} | {r['accounted'] / MIB:.1f} | {r['first'] / MIB:.1f} | "
                f"{r['peak'] / MIB:.1f} | {r['first'] / r['budget']:.3f} | {r['peak'] / r['budget']:.3f} | {r['heuristic']} | {r['steps']} / {r['chunks']} "
                f"| {r['left']} | {read} |"
            )
        rows.setdefault(model, []).append(row)
    for model in chosen:
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
    parser.add_argument("--heuristic", default="default", help="jdtr.grad's heuristic (default: its own default)")
    parser.add_argument("--only", choices=["eager", "remat"], help="one of the two tables")
    parser.add_argument("--jobs", type=int, default=1, help="measurements side by side (each process preallocates its share of the device)")
    parser.add_argument("--variants", nargs="+", default=["planned"], help="how jdtr.grad runs: planned (as is), serial, online, noslack")
    parser.add_argument("--models", nargs="+", help="jdtr.grad's models whose name contains every word of one of these (words joined by +)")
    parser.add_argument("--calls", type=int, default=3, help="jdtr.grad calls per process (at least 3)")
    parser.add_argument("--output")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global JOBS, CALLS
    JOBS, CALLS = max(1, args.jobs), max(3, args.calls)
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
            lines += eager_table(args.eager_ratios, args.heuristic, cache, tuple(args.variants), args.models) + [""]
        if args.only != "eager":
            lines += remat_table(args.ratios, cache) + [""]
    text = "\n".join(lines)
    print(text)
    write_report(args.output, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
