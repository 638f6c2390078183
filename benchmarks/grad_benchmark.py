"""jdtr.grad against jax.grad on the reference models, side by side.

For each model and budget ratio: peak/budget, evictions, rematerializations,
overhead (cost-model units), the heuristic the plan kept, the chunks a step
runs as, the first call's planning time and the second's chunk compilation,
and the step time of jdtr.grad planned (compiled chunks, from the third
call on) and online (the paper's algorithm, one equation per dispatch)
relative to `jax.jit(jax.grad)` and to un-jitted `jax.grad`. Every timing is
the median of `--repeats` runs, interleaved so that machine noise hits all
contenders alike.

Then a TreeLSTM (a model whose program is its input's shape): one tree run
again and again, and a fresh tree every call (traced, planned and run step
by step each time), against eager `jax.grad` on the same trees.

Then a model with a `lax.cond` on data per block (`models.gated_mlp`): with
one path (its batch's gates) in the models' table, and with its gates drawn
from a few patterns call by call (a plan per path, `--only conds`).

    python benchmarks/grad_benchmark.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import random
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import jdtr
from jdtr import models
from jdtr.transform import rental

rental.COMPILE_RATE = rental.CompileRate(0.0, weight=None)  # chunks from a plan's second run, as these tables measure (rental_benchmark.py: the rule)


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out)
    return time.perf_counter() - start, out


def write_report(path, text: str) -> None:
    """Appends a report to `path` (docs/benchmarks.md), where one was given."""
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    device = jax.devices()[0]
    return f"{cpu}, {os.cpu_count()} cores, JAX {jax.__version__} on {device.platform} ({device.device_kind})"


def bench_model(model, ratios, repeats):
    args = (model.params, model.batch)
    contenders = {"eager": jax.grad(model.loss), "jit": jax.jit(jax.grad(model.loss))}
    for r in ratios:
        contenders[("planned", r)] = jdtr.grad(model.loss, budget=r, return_stats=True)
        contenders[("online", r)] = jdtr.grad(model.loss, budget=r, return_stats=True, mode="online")
    first, second, failed = {}, {}, set()
    for name, fn in contenders.items():
        try:
            _, out = timed(fn, *args)
            if isinstance(name, tuple):
                first[name] = out[1]
                second[name] = timed(fn, *args)[1][1]  # compiles the plan's chunks
                third = timed(fn, *args)[1][1]  # (a path of conds: the plans it followed, refined on the second)
                second[name] = dataclasses.replace(
                    third, planning_time_s=second[name].planning_time_s + third.planning_time_s
                )
        except jdtr.OutOfBudgetError as err:
            failed.add(name)
            first[name] = err
    times = {name: [] for name in contenders if name not in failed}
    for _ in range(repeats):
        for name in times:
            times[name].append(timed(contenders[name], *args)[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for r in ratios:
        s = first[("planned", r)]
        if isinstance(s, Exception):
            rows.append(f"| {model.name} | {r} | out of budget (suggested: {s.suggested_budget_bytes / 2**20:.1f} MiB) | | | | | | | | | | |")
            continue
        c = second[("planned", r)]
        online = f"{med[('online', r)] / med['jit']:.2f}" if ("online", r) in med else "out of budget"
        rows.append(
            f"| {model.name} | {r} | {s.peak_bytes / s.budget_bytes:.3f} ({s.peak_bytes / 2**20:.1f} / {s.budget_bytes / 2**20:.1f} MiB) "
            f"| {s.evictions} | {s.rematerializations} | {s.overhead:.3f} | {s.heuristic}{_scans(s)} | {c.chunks} / {s.chunks} "
            f"| {c.peak_bytes / c.budget_bytes:.3f}, {c.overhead:.3f} "
            f"| {s.planning_time_s:.2f} / {c.planning_time_s:.2f} | {med[('planned', r)] / med['jit']:.2f} | {online} "
            f"| {med[('planned', r)] / med['eager']:.2f} |"
        )
    equations = next((s.equations for s in first.values() if not isinstance(s, Exception)), "?")
    baseline = f"| {model.name} | eager jax.grad {med['eager'] * 1e3:.1f} ms, jax.jit(jax.grad) {med['jit'] * 1e3:.1f} ms, {equations} equations |"
    return rows, baseline


def _scans(stats) -> str:
    """What a plan did with the program's scans (kept under a strategy, or unrolled), briefly."""
    if stats.scans is None:
        return ""
    return "; scans " + stats.scans.split(": ", 1)[-1].replace("each iteration saves ", "save ")


# ---------------------------------------------------------------- TreeLSTM


def random_tree(rng: random.Random, leaves: int):
    """A random binary tree over `leaves` token positions, as nested tuples of ints."""
    nodes = list(range(leaves))
    while len(nodes) > 1:
        i = rng.randrange(len(nodes) - 1)
        nodes[i : i + 2] = [(nodes[i], nodes[i + 1])]
    return nodes[0]


def tree_lstm(hidden: int, features: int, batch: int, leaves: int, seed: int = 0):
    """A child-sum-free binary TreeLSTM (Tai et al. 2015, N-ary form): the
    program is the tree, passed as a static argument."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    params = {
        "w_leaf": jax.random.normal(keys[0], (features, 2 * hidden)) / jnp.sqrt(features),
        "w_node": jax.random.normal(keys[1], (2 * hidden, 5 * hidden)) / jnp.sqrt(2 * hidden),
        "b_node": jnp.zeros((5 * hidden,)),
        "w_out": jax.random.normal(keys[2], (hidden, 1)) / jnp.sqrt(hidden),
    }
    tokens = jax.random.normal(keys[3], (leaves, batch, features))

    def loss(params, tokens, tree):
        def node(t):
            if isinstance(t, int):
                h, c = jnp.split(jnp.tanh(tokens[t] @ params["w_leaf"]), 2, axis=-1)
                return h, c
            (hl, cl), (hr, cr) = node(t[0]), node(t[1])
            gates = jnp.concatenate([hl, hr], axis=-1) @ params["w_node"] + params["b_node"]
            i, fl, fr, o, u = jnp.split(gates, 5, axis=-1)
            c = jax.nn.sigmoid(i) * jnp.tanh(u) + jax.nn.sigmoid(fl) * cl + jax.nn.sigmoid(fr) * cr
            return jax.nn.sigmoid(o) * jnp.tanh(c), c

        h, _ = node(tree)
        return jnp.mean((h @ params["w_out"]) ** 2)

    return loss, params, tokens


def child_sum_tree_lstm(hidden: int, batch: int, leaves: int, vocab: int = 1000, embed: int = 128, classes: int = 5, seed: int = 0):
    """The Child-Sum TreeLSTM (Tai et al. 2015) as a sentiment model is often
    written: an embedding per leaf token, a gate matrix per gate and per
    input, a forget gate per child, a softmax classifier at the root. The
    tree is a static argument of nested tuples of token positions."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 7)
    gates = "ifou"
    params = {
        "embed": jax.random.normal(keys[0], (vocab, embed)) * 0.1,
        "w": {g: jax.random.normal(k, (embed, hidden)) * 0.1 for g, k in zip(gates, jax.random.split(keys[1], 4))},
        "u": {g: jax.random.normal(k, (hidden, hidden)) * 0.1 for g, k in zip(gates, jax.random.split(keys[2], 4))},
        "b": {g: jnp.zeros((hidden,)) for g in gates},
        "classify": jax.random.normal(keys[3], (hidden, classes)) * 0.1,
    }
    ids = jax.random.randint(keys[4], (leaves, batch), 0, vocab)
    labels = jax.random.randint(keys[5], (batch,), 0, classes)

    def loss(params, batch_, tree):
        ids, labels = batch_

        def cell(x, children):
            h_sum = sum(h for h, _ in children) if children else jnp.zeros((x.shape[0], hidden))
            pre = {g: x @ params["w"][g] + h_sum @ params["u"][g] + params["b"][g] for g in "iou"}
            c = jax.nn.sigmoid(pre["i"]) * jnp.tanh(pre["u"])
            for h_k, c_k in children:
                c = c + jax.nn.sigmoid(x @ params["w"]["f"] + h_k @ params["u"]["f"] + params["b"]["f"]) * c_k
            return jax.nn.sigmoid(pre["o"]) * jnp.tanh(c), c

        def node(t):
            if isinstance(t, int):
                return cell(params["embed"][ids[t]], [])
            return cell(jnp.zeros((ids.shape[1], embed)), [node(k) for k in t])

        h, _ = node(tree)
        logp = jax.nn.log_softmax(h @ params["classify"])
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    return loss, params, (ids, labels)


def bench_tree_lstm(repeats: int, leaves: int = 44, hidden: int = 256, features: int = 64, batch: int = 32, child_sum: bool = False):
    """One tree repeated (planned once, then chunks) and a fresh tree each
    call (traced and planned every call), against eager `jax.grad` on the
    same trees, interleaved. `child_sum`: `child_sum_tree_lstm` instead of
    the N-ary `tree_lstm`, with embeddings of `features` over a vocabulary
    of `16 * features` tokens."""
    if child_sum:
        loss, params, tokens = child_sum_tree_lstm(hidden, batch, leaves, vocab=16 * features, embed=features)
        name = f"Child-Sum TreeLSTM (hidden {hidden}, batch {batch}, {leaves} leaves)"
    else:
        loss, params, tokens = tree_lstm(hidden, features, batch, leaves)
        name = f"TreeLSTM (hidden {hidden}, batch {batch}, {leaves} leaves)"
    rng = random.Random(0)
    eager = jax.grad(loss)
    fixed = random_tree(rng, leaves)
    repeated = jdtr.grad(loss, budget=0.5, return_stats=True)
    fresh = jdtr.grad(loss, budget=0.5, return_stats=True)
    warm = random_tree(rng, leaves)
    for _ in range(3):  # trace, plan, compile the repeated tree's chunks; compile the cells' executables
        timed(repeated, params, tokens, fixed)
    timed(fresh, params, tokens, warm)
    timed(eager, params, tokens, fixed)
    t_eager_fixed, t_repeated, t_eager_fresh, t_fresh, stats = [], [], [], [], []
    for _ in range(repeats):
        tree = random_tree(rng, leaves)
        t_eager_fixed.append(timed(eager, params, tokens, fixed)[0])
        t_repeated.append(timed(repeated, params, tokens, fixed)[0])
        t_eager_fresh.append(timed(eager, params, tokens, tree)[0])
        elapsed, (_, s) = timed(fresh, params, tokens, tree)
        t_fresh.append(elapsed)
        stats.append(s)
    _, (_, s_fixed) = timed(repeated, params, tokens, fixed)
    med = statistics.median
    return [
        f"| {name}, one tree repeated | {s_fixed.execution}, {s_fixed.chunks} dispatches, {s_fixed.evictions} evictions, overhead {s_fixed.overhead:.3f} "
        f"| {med(t_repeated) * 1e3:.1f} ms | {med(t_eager_fixed) * 1e3:.1f} ms | {med(t_repeated) / med(t_eager_fixed):.2f} |",
        f"| {name}, a fresh tree each call | {stats[-1].execution}; trace {med([s.trace_time_s for s in stats]):.2f} s, plan {med([s.planning_time_s for s in stats]):.2f} s "
        f"| {med(t_fresh) * 1e3:.1f} ms | {med(t_eager_fresh) * 1e3:.1f} ms | {med(t_fresh) / med(t_eager_fresh):.2f} |",
    ]


# ---------------------------------------------------------------- conds on data


def bench_paths(model, repeats: int, ratio: float = 0.5, patterns: int = 4):
    """`model` (a `gated_mlp`) with its gates drawn from `patterns` patterns,
    one a call in turn: planned (a plan per path), online, `jax.jit`."""
    x, gates = model.batch
    batches = [(x, jnp.where(jax.random.uniform(jax.random.PRNGKey(i), gates.shape) < 0.3, -1.0, 1.0)) for i in range(patterns)]
    planned = jdtr.grad(model.loss, budget=ratio, return_stats=True)
    online = jdtr.grad(model.loss, budget=ratio, return_stats=True, mode="online")
    jit = jax.jit(jax.grad(model.loss))
    for _ in range(3):  # plans of each path, then their chunks
        for batch in batches:
            timed(planned, model.params, batch)
    for batch in batches:
        timed(jit, model.params, batch)
        timed(online, model.params, batch)
    times = {"planned": [], "online": [], "jit": []}
    stats = []
    for _ in range(repeats):
        for batch in batches:
            for name, fn in (("planned", planned), ("online", online), ("jit", jit)):
                elapsed, out = timed(fn, model.params, batch)
                times[name].append(elapsed)
                if name == "planned":
                    stats.append(out[1])
    med = {k: statistics.median(v) for k, v in times.items()}
    (traced,) = planned.cache.values()
    paths = sum(len(plan.paths) for plan in traced.plans.values())
    return [
        f"| {model.name}, {patterns} gate patterns in turn | {ratio} | {stats[-1].execution}, "
        f"{statistics.median(s.chunks for s in stats):.0f} dispatches, {paths} plans beside the first, "
        f"max peak/budget {max(s.peak_bytes / s.budget_bytes for s in stats):.3f} "
        f"| {med['planned'] / med['jit']:.2f} | {med['online'] / med['jit']:.2f} | {med['jit'] * 1e3:.1f} ms |"
    ]


# ---------------------------------------------------------------- the optimum


def bench_optimum(ratios=(0.7, 0.6)):
    """The plan's overhead on the BatchNorm CNN against `jdtr.optimal`'s, per budget."""
    model = models.batchnorm_cnn()
    loss, args = model.loss, (model.params, model.batch)
    rows = []
    for ratio in ratios:
        f = jdtr.grad(loss, budget=ratio, return_stats=True)
        _, first = f(*args)
        _, second = f(*args)
        best = jdtr.optimal(jdtr.trace(loss, *args), second.budget_bytes, time_limit=120)
        proven = f"**{best.overhead:.4f}** (proven)" if best.status == "optimal" else (
            f"≤{best.overhead:.4f} ≥{best.bound / best.baseline_cost:.4f} ({best.solve_time_s:.0f} s)"
        )
        rows.append(
            f"| {ratio} | {first.heuristic} {first.overhead:.4f} | {second.heuristic} {second.overhead:.4f} "
            f"| {second.planning_time_s:.2f} s | {proven} | {second.overhead / best.overhead:.3f} |"
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.5, 0.3])
    parser.add_argument("--output", help="append the markdown report here")
    parser.add_argument("--small", action="store_true", help="small models (a quick check)")
    parser.add_argument(
        "--only", choices=["models", "flax", "trees", "optimum", "conds"], nargs="+",
        default=["models", "flax", "trees", "optimum", "conds"],
        help="which parts to run (default: all)",
    )
    args = parser.parse_args(argv)
    if args.small:
        suite = [models.mlp_chain(16, 64, 256), models.rnn(16, 32, 8, 64)] if "models" in args.only else []
        flax = [models.flax_scan_lstm(steps=8, hidden=32, features=8, batch=16)] if "flax" in args.only else []
        tree = dict(leaves=8, hidden=16, features=8, batch=128)
        child_sum = dict(hidden=32, features=8)
        gated = [models.gated_mlp(blocks=6, width=32, batch=64)] if "conds" in args.only else []
    else:
        suite = [
            models.mlp_chain(layers=64, width=256, batch=2048),
            models.resnet(blocks=4, channels=32, image=32, batch=16),
            models.transformer(blocks=4, dim=128, heads=4, seq=128, batch=8, vocab=256),
            models.rnn(steps=64, hidden=256, features=64, batch=256),
        ] if "models" in args.only else []
        # The kinds of model issue 21's goals are checked on, in Flax NNX.
        flax = [
            models.flax_gpt(layers=4, dim=128, heads=4, seq=128, batch=8, vocab=256),
            models.flax_resnet_groupnorm(blocks=8, channels=32, image=32, batch=16),
            models.flax_scan_lstm(steps=64, hidden=256, features=64, batch=64),
            models.flax_scan_gpt(layers=12, dim=128, heads=4, seq=128, batch=8, vocab=256),
        ] if "flax" in args.only else []
        tree = {}
        child_sum = dict(hidden=512, features=128)
        gated = [models.gated_mlp(blocks=16, width=256, batch=1024)] if "conds" in args.only else []
    lines = [
        "| model | budget ratio | peak/budget | evictions | rematerializations | overhead | heuristic kept | chunks / steps "
        "| compiled: peak/budget, overhead | planning s / compile s | planned / jit | online / jit | planned / eager |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    baselines = []
    for model in [*suite, *flax, *gated]:
        print(f"benchmarking {model.name} ...", file=sys.stderr)
        rows, baseline = bench_model(model, args.ratios, args.repeats)
        lines += rows
        baselines.append(baseline)
        print("\n".join(rows), file=sys.stderr)
    print("benchmarking the TreeLSTM ...", file=sys.stderr)
    trees = []
    if "trees" in args.only:
        trees = bench_tree_lstm(args.repeats, **tree)
        # The Child-Sum form, larger: the fresh trees' hardest case measured (2026-12-06).
        trees += bench_tree_lstm(args.repeats, **{**tree, **child_sum}, child_sum=True)
    print("benchmarking the optimum ...", file=sys.stderr)
    optimum = bench_optimum() if "optimum" in args.only else []
    print("benchmarking paths ...", file=sys.stderr)
    paths = [row for model in gated for row in bench_paths(model, args.repeats)]
    report = "\n".join(
        [
            f"### jdtr.grad planned (heuristic=\"auto\"), {datetime.date.today().isoformat()}",
            "",
            f"Machine: {machine()}. Median of {args.repeats} interleaved runs. Overhead in cost-model units "
            "((base + remat) / base). \"chunks / steps\": dispatches of a compiled step (the third call) / of the plan's first, "
            "step-by-step run. \"compiled\": the third call's plan, made for less than the budget where that saves chunks. "
            "\"planning s / compile s\": the first call's simulations / the second and third calls' planning, cutting and "
            "compiling of chunks. "
            "Times relative to `jax.jit(jax.grad)` and un-jitted `jax.grad`, measured in the same run; \"online\" is "
            "`mode=\"online\"` (the paper's algorithm, one equation per dispatch).",
            "",
            *lines,
            "",
            "| model | baselines |",
            "|---|---|",
            *baselines,
            "",
            "| TreeLSTM at budget 0.5 | jdtr | jdtr.grad | eager jax.grad | ratio |",
            "|---|---|---|---|---|",
            *trees,
            "",
            "| BatchNorm CNN (issue 21), budget ratio | first call's plan | the plan once it came back "
            "| its planning | jdtr.optimal | plan / optimum |",
            "|---|---|---|---|---|---|",
            *optimum,
            "",
            "| a cond on data per block, paths varying | budget ratio | jdtr | planned / jit | online / jit | jax.jit(jax.grad) |",
            "|---|---|---|---|---|---|",
            *paths,
            "",
        ]
    )
    print(report)
    write_report(args.output, report)


if __name__ == "__main__":
    main()
