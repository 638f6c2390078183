"""`jdtr.plan` and `jdtr.grad` on sharded arguments: bytes per device on a CPU mesh.

Runs on 8 host CPU devices (it sets `XLA_FLAGS` itself, before JAX starts).
For each model, mesh and budget: XLA's bytes per device of the planned step
(`memory_analysis()` of the partitioned program) against the budget and
against `jax.jit(jax.grad)`'s bytes per device, and the largest gradient
difference from `jax.grad`. With `--grad`, the same for `jdtr.grad`: its
peak per device by its own count and by the arrays' shards (`debug=True`),
and its step time against `jax.jit(jax.grad)` (medians of interleaved
repeats; they mean little on a 2-core machine running 8 devices).

    python benchmarks/sharded_benchmark.py --output docs/benchmarks.md
    python benchmarks/sharded_benchmark.py --grad --output docs/benchmarks.md
    python benchmarks/sharded_benchmark.py --grad --manual   # a loss that is one shard_map
    python benchmarks/sharded_benchmark.py --manual          # the same, planned for jax.jit
    python benchmarks/sharded_benchmark.py --grad --gpt      # a Flax GPT, Megatron-style kernels
    python benchmarks/sharded_benchmark.py --first-call plan   # one fresh structure, in this process
    python benchmarks/sharded_benchmark.py --jit --output docs/benchmarks.md

`--jit` plans under `jax.jit` on a mesh with Explicit axes, without
`jax.set_mesh` (`jax.jit(jdtr.remat_grad(loss, budget=...))` as users write
it), beside the plan made on the arrays themselves: bytes per device of
each, and whether jdtr warned that it planned whole arrays.

`--first-call plan|grad` times one structure's first `jdtr.plan` (budget
0.5, without autotuning), or `jdtr.grad`'s first and second calls, on a loss
of `--layers` `shard_map` layers with a `psum` each, data parallel over the 8
devices. Run it in a fresh process for each measure (caches are per process).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import jdtr  # noqa: E402
from jdtr import models  # noqa: E402
from jdtr.transform import rental  # noqa: E402

rental.COMPILE_RATE = rental.CompileRate(0.0, weight=None)  # chunks from a plan's second run, as these tables measure (rental_benchmark.py: the rule)

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from grad_benchmark import machine, timed, write_report  # noqa: E402
from scan_benchmark import interleaved_medians  # noqa: E402

MODELS = {
    "mlp16x256_b8192": lambda: models.mlp_chain(16, 256, 8192),
    "mlp48x32_b4096": lambda: models.mlp_chain(48, 32, 4096),
}
MESHES = {
    "data 8": ((8,), ("data",), P()),
    "data 2 x model 4": ((2, 4), ("data", "model"), P(None, "model")),
}


def per_device(fn, *args) -> int:
    a = jax.jit(fn).lower(*args).compile().memory_analysis()
    return a.argument_size_in_bytes + a.output_size_in_bytes + a.temp_size_in_bytes - a.alias_size_in_bytes


def placed(m, shape, names, weights, axis_type):
    """The model's params (sharded as `weights`) and batch (over "data") on a
    mesh, `jax.jit(jax.grad)`'s bytes per device and its gradients."""
    mesh = jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))
    params = jax.device_put(m.params, NamedSharding(mesh, weights))
    x = jax.device_put(m.batch, NamedSharding(mesh, P("data")))
    return params, x, per_device(jax.grad(m.loss), params, x), jax.jit(jax.grad(m.loss))(params, x)


def rows(model_name: str, ratios) -> list[str]:
    m = MODELS[model_name]()
    single = per_device(jax.grad(m.loss), m.params, m.batch)
    out = []
    for mesh_name, (shape, names, weights) in MESHES.items():
        params, x, full, reference = placed(m, shape, names, weights, AxisType.Auto)
        for ratio in ratios:
            try:
                plan = jdtr.plan(m.loss, params, x, budget=ratio, autotune=False)
            except jdtr.OutOfBudgetError as err:
                why = "the arguments and gradients alone exceed it" if "alone" in str(err) else "no plan fits"
                works = err.suggested_budget_bytes
                over = f", {works - err.budget_bytes} B over" if works and works - err.budget_bytes < 2**20 else ""
                smallest = f"; the smallest plan found: {works / 2**20:.2f} MiB ({works / full:.3f}{over})" if works else ""
                out.append(f"| {model_name} | {mesh_name} | {ratio} | {full / 2**20:.2f} | {why}{smallest} | | | |")
                continue
            grads = jax.jit(plan.grad)(params, x)
            error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(grads, reference))
            out.append(
                f"| {model_name} | {mesh_name} | {ratio} | {full / 2**20:.2f} | {plan.compiled_bytes / 2**20:.2f} | "
                f"{plan.compiled_bytes / plan.budget_bytes:.3f} | {plan.compiled_bytes / full:.3f} | {error:.1e} |"
            )
    out.append(f"| {model_name} | one device | | {single / 2**20:.2f} | | | | |")
    return out


def jit_rows(model_name: str, ratios) -> list[str]:
    """Per mesh (Explicit axes, no `jax.set_mesh`) and budget: the plan made
    under `jax.jit` on the arrays' types beside the one made on the arrays."""
    import warnings

    m = MODELS[model_name]()
    out = []
    for mesh_name, (shape, names, weights) in MESHES.items():
        params, x, full, reference = placed(m, shape, names, weights, AxisType.Explicit)
        for ratio in ratios:
            cells = []
            for jitted in (False, True):
                loss = lambda p, b: m.loss(p, b)  # noqa: E731 - planned afresh each time
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    try:
                        if jitted:
                            step = jdtr.remat_grad(loss, budget=ratio, autotune=False)
                            nbytes, grads = per_device(step, params, x), jax.jit(step)(params, x)
                        else:
                            plan = jdtr.plan(loss, params, x, budget=ratio, autotune=False)
                            nbytes, grads = plan.compiled_bytes, jax.jit(plan.grad)(params, x)
                    except jdtr.OutOfBudgetError as err:
                        works = err.suggested_budget_bytes
                        cells.append(f"no plan fits; suggests {works / full:.3f}" if works else "no plan fits")
                        continue
                error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(grads, reference))
                warned = ", warned: whole arrays" if any("per device" in str(w.message) for w in seen) else ""
                cells.append(f"{nbytes / full:.3f} ({error:.0e}){warned}")
            out.append(f"| {model_name} | {mesh_name} | {ratio} | {full / 2**20:.2f} | {cells[0]} | {cells[1]} |")
    return out


def grad_rows(model_name: str, ratios, repeats: int) -> list[str]:
    """`jdtr.grad` per mesh and budget: bytes per device and step times."""
    m = MODELS[model_name]()
    out = []
    for mesh_name, (shape, names, weights) in MESHES.items():
        mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
        params = jax.device_put(m.params, NamedSharding(mesh, weights))
        x = jax.device_put(m.batch, NamedSharding(mesh, P("data")))
        out += [_grad_row(model_name, mesh_name, m.loss, params, x, ratio, repeats) for ratio in ratios]
    return out


def manual_rows(ratios, repeats: int, layers: int = 8, width: int = 256, batch: int = 4096) -> list[str]:
    """`jdtr.grad` on a loss written as one `shard_map` (Megatron-style
    layers: a column- then a row-sharded matmul, a `psum` over each axis)."""
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    m = models.megatron_shard_map(mesh, layers, width, batch)
    name = f"one shard_map, {layers} Megatron layers of {width}, batch {batch}"
    return [_grad_row(name, "data 2 x model 4", m.loss, m.params, m.batch, ratio, repeats) for ratio in ratios]


def manual_plan_rows(ratios, repeats: int, layers: int = 8, width: int = 128, batch: int = 4096) -> list[str]:
    """`jdtr.plan` on a loss written as one `shard_map`, on each kind of
    axes: bytes per device, and the step's time against `jax.jit(jax.grad)`'s."""
    out = []
    for axis_type in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)
        m = models.megatron_shard_map(mesh, layers, width, batch)
        name = f"one shard_map, {layers} Megatron layers of {width}, batch {batch}"
        jit = jax.jit(jax.grad(m.loss))
        full, reference = per_device(jax.grad(m.loss), m.params, m.batch), jit(m.params, m.batch)
        for ratio in ratios:
            try:
                plan = jdtr.plan(m.loss, m.params, m.batch, budget=ratio, autotune=False)
            except jdtr.OutOfBudgetError as err:
                works = err.suggested_budget_bytes
                out.append(f"| {name} | {axis_type.name} | {ratio} | {full / 2**20:.2f} | no plan fits; suggests {works / full:.3f} | | |")
                continue
            step = jax.jit(plan.grad)
            error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(step(m.params, m.batch)), jax.tree.leaves(reference)))
            medians = interleaved_medians({"jit": jit, "plan": step}, (m.params, m.batch), repeats)
            out.append(
                f"| {name} | {axis_type.name} | {ratio} | {full / 2**20:.2f} | {plan.compiled_bytes / full:.3f} | "
                f"{medians['plan'] / medians['jit']:.2f}x | {error:.1e} |"
            )
    return out


def _grad_row(model_name: str, mesh_name: str, loss, params, x, ratio: float, repeats: int) -> str:
    compiled = jax.jit(jax.grad(loss))
    full = per_device(jax.grad(loss), params, x)
    reference = compiled(params, x)
    step = jdtr.grad(loss, budget=ratio, return_stats=True)
    try:
        first, (_, stats) = timed(step, params, x)
        checked = jdtr.grad(loss, budget=ratio, return_stats=True, debug=True)(params, x)[1]
    except jdtr.OutOfBudgetError as err:
        return f"| {model_name} | {mesh_name} | {ratio} | {full / 2**20:.2f} | no plan fits: {err.suggested_budget_bytes} B | | | | | | | | |"
    times: dict[str, list[float]] = {"jdtr": [], "jit": []}
    for _ in range(repeats):  # interleaved, after the first (planning) call and a chunked one
        times["jdtr"].append(timed(step, params, x)[0])
        times["jit"].append(timed(compiled, params, x)[0])
    grads, stats = step(params, x)
    leaves = list(zip(jax.tree.leaves(grads), jax.tree.leaves(reference)))
    error = max(float(jnp.max(jnp.abs(a - b))) for a, b in leaves)
    placed_alike = sum(a.sharding.is_equivalent_to(b.sharding, a.ndim) for a, b in leaves)
    ratio_time = statistics.median(times["jdtr"]) / statistics.median(times["jit"])
    return (
        f"| {model_name} | {mesh_name} | {ratio} | {full / 2**20:.2f} | {stats.unconstrained_peak_bytes / 2**20:.2f} | "
        f"{stats.budget_bytes / 2**20:.2f} | {stats.peak_bytes / 2**20:.2f} | {checked.live_peak_bytes / 2**20:.2f} | "
        f"{stats.chunks} ({stats.equations} equations) | {first:.1f} s | {ratio_time:.2f} | {error:.1e} | "
        f"{placed_alike} of {len(leaves)} |"
    )


def gpt_rows(ratios, repeats: int, blocks: int = 4, dim: int = 128, seq: int = 64, batch: int = 32) -> list[str]:
    """`jdtr.grad` on a Flax NNX GPT over the 2x4 mesh with Auto axes
    (`models.flax_gpt_megatron`: kernels split over "model" Megatron's way,
    tokens over "data"). Here the whole step shards some gradients otherwise
    than their equations alone."""
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    m = models.flax_gpt_megatron(mesh, blocks=blocks, dim=dim, seq=seq, batch=batch)
    name = f"Flax GPT {blocks}x{dim}, seq {seq}, batch {batch}"
    return [_grad_row(name, "data 2 x model 4", m.loss, m.params, m.batch, ratio, repeats) for ratio in ratios]


def shard_map_layers(mesh, layers: int):
    """A loss of `layers` `shard_map` layers (tanh of a matmul, scaled by a
    `psum` of its mean square) and its arguments: weights replicated, the
    batch split over the mesh's "data" axis."""
    m = models.mlp_chain(layers=layers, width=32, batch=4096)

    def layer(w, h):
        h = jnp.tanh(h @ w)
        return h * jax.lax.rsqrt(jax.lax.psum(jnp.mean(h * h), "data") / mesh.size + 1.0)

    def loss(ws, x):
        for w in ws:
            x = jax.shard_map(layer, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data"))(w, x)
        return jnp.mean(x**2)

    params = jax.device_put(m.params, NamedSharding(mesh, P()))
    return loss, params, jax.device_put(m.batch, NamedSharding(mesh, P("data")))


def first_call(what: str, layers: int) -> str:
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    loss, params, x = shard_map_layers(mesh, layers)
    if what == "plan":
        seconds, _ = timed(lambda: jdtr.plan(loss, params, x, budget=0.5, autotune=False))
        return f"| {layers} shard_map layers | jdtr.plan, budget 0.5 | {seconds:.2f} s | |"
    step = jdtr.grad(loss, budget=0.5)
    first, _ = timed(step, params, x)
    second, _ = timed(step, params, x)
    return f"| {layers} shard_map layers | jdtr.grad, budget 0.5 | {first:.2f} s | {second:.2f} s |"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.5, 0.3])
    parser.add_argument("--output")
    parser.add_argument("--grad", action="store_true", help="jdtr.grad instead of jdtr.plan")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--manual", action="store_true", help="only the loss written as one shard_map (planned; with --grad: jdtr.grad)")
    parser.add_argument("--gpt", action="store_true", help="with --grad: only the Flax GPT")
    parser.add_argument("--first-call", choices=("plan", "grad"), help="time one structure's first plan or call")
    parser.add_argument("--layers", type=int, default=24, help="with --first-call: shard_map layers")
    parser.add_argument("--jit", action="store_true", help="plans under jax.jit on an Explicit mesh, without jax.set_mesh")
    args = parser.parse_args(argv)
    if args.jit:
        lines = [f"### `jax.jit(jdtr.remat_grad)` on an `Explicit` mesh without `jax.set_mesh` (issue 24), "
                 f"{datetime.date.today().isoformat()}", "",
                 f"Command: `python benchmarks/sharded_benchmark.py --jit`. Machine: {machine()}, 8 host devices. "
                 "Bytes per device of the partitioned step over `jax.jit(jax.grad)`'s (and the largest gradient "
                 "difference from it), `autotune=False`: the plan made on the sharded arrays (`jdtr.plan`), and the "
                 "one `jax.jit(jdtr.remat_grad(loss, budget=...))` makes from the arguments' types.", "",
                 "| model | mesh | budget | jax.jit(jax.grad) MiB per device | planned on the arrays | planned under jax.jit |",
                 "|---|---|---|---|---|---|"]
        for name in MODELS:
            print(f"benchmarking {name} under jax.jit ...", file=sys.stderr)
            lines += jit_rows(name, [r for r in args.ratios if r < 1.0])
        text = "\n".join(lines)
        print(text)
        write_report(args.output, text)
        return
    if args.manual and not args.grad:
        lines = [f"### `jdtr.plan` on a loss written as one `shard_map` (issue 24), {datetime.date.today().isoformat()}", "",
                 f"Command: `python benchmarks/sharded_benchmark.py --manual`. Machine: {machine()}, 8 host devices, "
                 "a 2x4 mesh. Bytes per device of the planned step over `jax.jit(jax.grad)`'s; its step time over "
                 f"`jax.jit(jax.grad)`'s (medians of {args.repeats} interleaved runs; 8 devices on 2 cores: a rough "
                 "guide); the largest gradient difference from it. `autotune=False`.", "",
                 "| model | axes | budget | jax.jit(jax.grad) MiB per device | plan / jax.grad's | step / jax.grad's | max grad difference |",
                 "|---|---|---|---|---|---|---|"]
        lines += manual_plan_rows([r for r in args.ratios if r < 1.0], args.repeats)
        text = "\n".join(lines)
        print(text)
        write_report(args.output, text)
        return
    if args.first_call:
        print(first_call(args.first_call, args.layers))
        return
    if args.grad:
        lines = [f"### `jdtr.grad` on sharded arguments: bytes per device on an 8-device CPU mesh (issue 24), "
                 f"{datetime.date.today().isoformat()}", "",
                 f"Command: `python benchmarks/sharded_benchmark.py --grad`. Machine: {machine()}, 8 host devices. "
                 "A budget is a fraction of `jdtr.grad`'s unconstrained peak per device. Peaks: `Stats.peak_bytes` "
                 "(jdtr's count) and `Stats.live_peak_bytes` (`debug=True`: the shards of `jax.live_arrays()` per "
                 "device, after every step). Step time: median of interleaved repeats against `jax.jit(jax.grad)` "
                 "(8 devices on 2 cores: a rough guide only).", "",
                 "| model | mesh | budget | jax.jit(jax.grad) MiB per device | unconstrained peak MiB | budget MiB | "
                 "peak MiB | live peak MiB | dispatches (equations) | first call | step / jax.jit(jax.grad) | max grad difference | "
                 "gradients sharded as jax.jit(jax.grad)'s |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name in [] if args.manual or args.gpt else MODELS:
            print(f"benchmarking jdtr.grad on {name} ...", file=sys.stderr)
            lines += grad_rows(name, args.ratios, args.repeats)
        if not args.gpt:
            lines += manual_rows(args.ratios, args.repeats)
        if not args.manual:
            lines += gpt_rows(args.ratios, args.repeats)
        text = "\n".join(lines)
        print(text)
        write_report(args.output, text)
        return
    lines = [f"### Sharded arguments: bytes per device on an 8-device CPU mesh (issue 24), {datetime.date.today().isoformat()}", "",
             f"Command: `python benchmarks/sharded_benchmark.py`. Machine: {machine()}, 8 host devices. "
             "Bytes: XLA's arguments + outputs + temporaries per device, of the partitioned step.", "",
             "| model | mesh | budget | jax.grad MiB per device | plan MiB per device | / budget | / jax.grad's | max grad difference |",
             "|---|---|---|---|---|---|---|---|"]
    for name in MODELS:
        print(f"benchmarking {name} ...", file=sys.stderr)
        lines += rows(name, args.ratios)
    text = "\n".join(lines)
    print(text)
    write_report(args.output, text)


if __name__ == "__main__":
    main()
