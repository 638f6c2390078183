"""What a compiled `jdtr.grad` step costs on the host, by the cap on a
chunk's computations (issue 21, `jdtr/transform/chunks.py`), side by side.

A step runs as compiled chunks; each chunk is one dispatch, and each array
that crosses from one chunk to the next is an output of one and an input
of the other. On a GPU, where `jax.jit(jax.grad)` runs a small model's
step in about a millisecond, what the host spends on those dispatches and
arrays can set the pace. A chunk holds at most a capped number of
computations on the CPU (`chunks.MAX_CHUNK_EQUATIONS`: XLA's code for a
whole step can run slower there than for its parts) where the plan's
computations are long enough (`chunks.CAPPED_ABOVE_SECONDS`), and none
elsewhere (`chunks.chunk_cap`); this runs the same models with each cap of
`--caps` (0: none; "auto": jdtr's own rule) on the backend it runs on, in
one process:

- chunks a step, and the arrays that cross between them (outputs of one
  chunk read by a later one, the deletes between chunks);
- the second call's cutting and compiling time (each contender from an
  empty chunk cache);
- "host": the time until the call returns, without waiting for the device
  (dispatch is asynchronous), and "step": until its results are ready;
  medians of `--repeats` interleaved runs, against `jax.jit(jax.grad)`'s.

    python benchmarks/chunk_cost.py --models transformer resnet --ratios 1.0 0.5 --caps 512 0 auto
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax

import jdtr
import jdtr.transform.chunks as chunks
from jdtr import models
from jdtr.transform import rental

rental.COMPILE_RATE = rental.CompileRate(0.0, weight=None)  # chunks from a plan's second run, as these tables measure (rental_benchmark.py: the rule)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grad_benchmark import timed  # noqa: E402
from slack_benchmark import report, warm_up  # noqa: E402

MODELS = {
    "mlp": lambda: models.mlp_chain(layers=64, width=256, batch=2048),
    "resnet": lambda: models.resnet(blocks=4, channels=32, image=32, batch=16),
    "transformer": lambda: models.transformer(blocks=4, dim=128, heads=4, seq=128, batch=8, vocab=256),
    "flax_gpt": lambda: models.flax_gpt(layers=4, dim=128, heads=4, seq=128, batch=8, vocab=256),
    "flax_resnet": lambda: models.flax_resnet_groupnorm(blocks=8, channels=32, image=32, batch=16),
    # Small enough that the host's part shows on 2 CPU cores too.
    "transformer-small": lambda: models.transformer(blocks=4, dim=32, heads=2, seq=64, batch=4, vocab=16),
    "recurrence": lambda: models.linear_recurrence(layers=4, steps=256, width=64, batch=8),
}


def crossing(items) -> tuple[int, int]:
    """Arrays a compiled step passes from chunk to chunk (chunk outputs),
    and the deletes the host makes between chunks."""
    outputs = sum(len(item.outputs) for item in items if type(item) is chunks.Chunk)
    deletes = sum(len(item.frees) for item in items if type(item) is chunks.Chunk)
    deletes += sum(len(item.slots) for item in items if type(item) is chunks.Delete)
    return outputs, deletes


def compiled_items(fn):
    """The chunks of the plan `fn` (a `jdtr.grad`) last ran by."""
    plans = [plan for traced in fn.cache.values() for plan in traced.plans.values() if getattr(plan, "compiled", None)]
    return plans[-1].compiled if plans else []


def host_and_step(fn, args) -> tuple[float, float]:
    start = time.perf_counter()
    out = fn(*args)
    returned = time.perf_counter()
    jax.block_until_ready(out)
    return returned - start, time.perf_counter() - start


def bench(model, ratios, caps, repeats) -> list[str]:
    args = (model.params, model.batch)
    jit = jax.jit(jax.grad(model.loss))
    timed(jit, *args)
    contenders = {"jit": jit}
    stats = {}
    saved = chunks.MAX_CHUNK_EQUATIONS, chunks.CAPPED_PLATFORMS, chunks.CAPPED_ABOVE_SECONDS
    for ratio in ratios:
        for cap in caps:
            loss = lambda *a, loss=model.loss: loss(*a)  # noqa: E731 (a function of its own: plans are cached per function)
            fn = jdtr.grad(loss, budget=ratio, return_stats=True)
            if cap != "auto":  # the cap on this backend whatever its default and the plan's costs (0: none)
                chunks.MAX_CHUNK_EQUATIONS, chunks.CAPPED_ABOVE_SECONDS = int(cap), 0.0
                chunks.CAPPED_PLATFORMS = frozenset({jax.default_backend()} if int(cap) else ())
            chunks.clear_chunk_cache()  # each compiles its own chunks (plans compiled before keep theirs)
            try:
                runs = warm_up(fn, args)
            except jdtr.OutOfBudgetError:
                continue
            finally:
                chunks.MAX_CHUNK_EQUATIONS, chunks.CAPPED_PLATFORMS, chunks.CAPPED_ABOVE_SECONDS = saved
            fn.return_stats = False  # timed as a training loop calls it: returns once dispatched
            contenders[(ratio, cap)], stats[(ratio, cap)] = fn, (runs, crossing(compiled_items(fn)))
    host = {name: [] for name in contenders}
    step = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            h, s = host_and_step(fn, args)
            host[name].append(h)
            step[name].append(s)
    med_host = {name: statistics.median(t) for name, t in host.items()}
    med_step = {name: statistics.median(t) for name, t in step.items()}
    rows = []
    for (ratio, cap), (runs, (outputs, deletes)) in stats.items():
        last = runs[-1]
        compile_s = sum(s.planning_time_s for s in runs[1:])
        rows.append(
            f"| {model.name} | {ratio} | {cap} | {last.chunks} | {outputs} / {deletes} | {compile_s:.2f} "
            f"| {med_host[(ratio, cap)] * 1e3:.2f} | {med_step[(ratio, cap)] * 1e3:.2f} | {med_step[(ratio, cap)] / med_step['jit']:.2f} |"
        )
    rows.append(
        f"| {model.name} | jax.jit(jax.grad) | | 1 | | | {med_host['jit'] * 1e3:.2f} | {med_step['jit'] * 1e3:.2f} | 1.00 |"
    )
    return rows


def _cap(text: str) -> str:
    if text != "auto" and not text.isdigit():
        raise argparse.ArgumentTypeError(f"a cap is a count of computations, 0 or auto, not {text!r}")
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["transformer", "resnet", "mlp"])
    parser.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.5])
    parser.add_argument("--caps", nargs="+", default=["512", "0", "auto"], type=_cap,
                        help="computations a chunk, at most (0: no cap; auto: jdtr's rule)")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--output", help="append the markdown report here")
    args = parser.parse_args(argv)
    header = "| model | budget | cap | chunks | arrays crossing / deletes | compile s | host ms | step ms | step / jit |"
    return report("Chunk caps side by side", args.repeats, header, args.models,
                  lambda name: bench(MODELS[name](), args.ratios, args.caps, args.repeats), args.output)


if __name__ == "__main__":
    sys.exit(main())
