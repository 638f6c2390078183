"""jdtr.remat_grad against jax.checkpoint's built-in choices: step time and compiled memory.

For each model, every contender is compiled with `jax.jit` and measured by
XLA's `memory_analysis()` (arguments + outputs + temporaries) and by the
median step time over interleaved runs. On the CPU, XLA's
`cse_barrier_expander` pass undoes plain `jax.checkpoint`; the built-in
choices are therefore compiled with that pass disabled (their best case),
while jdtr's plans use default compiler options (its segments survive it).

    python benchmarks/remat_benchmark.py --output docs/benchmarks.md --plot docs/images/remat_pareto.png
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys
import time

import jax
from jax import checkpoint_policies as cp

import jdtr
from jdtr import models

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from grad_benchmark import machine, write_report  # noqa: E402

NO_CSE = {"xla_disable_hlo_passes": "cse_barrier_expander"}
# A built-in choice at most this much faster than a jdtr plan and no larger
# is reported as a tie, not as dominating it: medians of a few runs on a
# shared machine differ by this much between identical steps.
TIE = 0.02


def compiled(fn, args, options=None):
    jitted = jax.jit(fn, compiler_options=options) if options else jax.jit(fn)
    exe = jitted.lower(*args).compile()
    a = exe.memory_analysis()
    return exe, a.argument_size_in_bytes + a.output_size_in_bytes + a.temp_size_in_bytes - a.alias_size_in_bytes


def contenders(factory, layers, ratios):
    k = max(1, round(math.sqrt(layers)))
    plain = factory()
    out = [("no remat", plain.loss, None)]
    for label, policy in [("per layer, nothing_saveable", cp.nothing_saveable), ("per layer, dots_saveable", cp.dots_saveable),
                          ("per layer, everything_saveable", cp.everything_saveable)]:
        seg = lambda f, policy=policy: jax.checkpoint(f, policy=policy)  # noqa: E731
        out.append((label, factory(segment=seg, every=1).loss, NO_CSE))
    seg = lambda f: jax.checkpoint(f, policy=cp.nothing_saveable)  # noqa: E731
    out.append((f"every {k} layers (sqrt N)", factory(segment=seg, every=k).loss, NO_CSE))
    return plain, out


def run(name, factory, layers, ratios, repeats, tune=True):
    plain, builtins = contenders(factory, layers, ratios)
    args = (plain.params, plain.batch)
    rows = []
    for label, loss, options in builtins:
        exe, nbytes = compiled(jax.grad(loss), args, options)
        rows.append({"label": label, "bytes": nbytes, "exe": exe, "budget": None})
    unconstrained = rows[0]["bytes"]
    for ratio in ratios:
        for autotune in (True, False) if tune else (True,):
            start = time.perf_counter()
            try:
                plan = jdtr.plan(plain.loss, *args, budget=ratio, autotune=autotune)
            except jdtr.OutOfBudgetError as err:
                print(f"budget {ratio}: no plan fits ({err})", file=sys.stderr)
                break
            planning = time.perf_counter() - start
            exe, nbytes = compiled(plan.grad, args)
            label = f"jdtr.remat_grad budget {ratio}" + ("" if autotune else ", autotune=False")
            rows.append({"label": label, "bytes": nbytes, "exe": exe, "budget": plan.budget_bytes,
                         "segments": len(plan.segments), "depth": max((seg.depth for seg in plan.segments), default=0),
                         "origin": plan.origin, "planning": planning})
    times = {r["label"]: [] for r in rows}
    for r in rows:
        jax.block_until_ready(r["exe"](*args))
    for _ in range(repeats):
        for r in rows:
            t = time.perf_counter()
            jax.block_until_ready(r["exe"](*args))
            times[r["label"]].append(time.perf_counter() - t)
    for r in rows:
        r["time"] = statistics.median(times[r["label"]])
        del r["exe"]
    base_time = rows[0]["time"]
    lines = [f"**{name}** (no remat: {unconstrained / 2**20:.1f} MiB, {base_time * 1e3:.1f} ms per step)", "",
             "| contender | compiled MiB | vs no remat | step ms | vs no remat | budget MiB | segments (depth), planning s | on the Pareto front vs built-ins |", "|---|---|---|---|---|---|---|---|"]
    builtin_rows = rows[: len(builtins)]
    for r in rows:
        front = ""
        if r["budget"] is not None:
            smaller = [b for b in builtin_rows if b["bytes"] <= r["bytes"]]
            dominated = [b["label"] for b in smaller if b["time"] < r["time"] * (1 - TIE)]
            tied = [b["label"] for b in smaller if r["time"] * (1 - TIE) <= b["time"] < r["time"]]
            front = "no: " + ", ".join(dominated) if dominated else "yes"
            if tied and not dominated:
                front += f" (within {TIE:.0%}: " + ", ".join(tied) + ")"
        budget = "" if r["budget"] is None else f"{r['budget'] / 2**20:.1f}"
        shape = "" if r["budget"] is None else f"{r['segments']} ({r['depth']}{', uniform' if r['origin'] == 'uniform' else ''}), {r['planning']:.0f}"
        lines.append(
            f"| {r['label']} | {r['bytes'] / 2**20:.1f} | {r['bytes'] / unconstrained:.2f} | {r['time'] * 1e3:.1f} | "
            f"{r['time'] / base_time:.2f} | {budget} | {shape} | {front} |"
        )
    return lines, rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.7, 0.5, 0.35])
    parser.add_argument("--output")
    parser.add_argument("--plot")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--only", nargs="+", help="models whose name contains one of these words (MLP, Transformer, ResNet, RNN, CNN)")
    parser.add_argument("--tuned-only", action="store_true", help="leave out the remat_grad(autotune=False) rows")
    args = parser.parse_args(argv)
    if args.small:
        suite = [("MLP chain 16x64, batch 512", lambda **kw: models.mlp_chain(16, 64, 512, **kw), 16)]
    else:
        suite = [
            ("MLP chain, 64 layers, width 256, batch 2048", lambda **kw: models.mlp_chain(64, 256, 2048, **kw), 64),
            ("Transformer, 6 blocks, dim 128, seq 128, batch 8", lambda **kw: models.transformer(6, 128, 4, 128, 8, 256, **kw), 6),
            ("ResNet (BatchNorm), 8 blocks, 32 channels, 32x32, batch 16", lambda **kw: models.resnet(8, 32, 32, 16, **kw), 8),
            ("RNN in lax.scan, 64 steps, hidden 256, batch 64", lambda **kw: models.rnn(64, 256, 64, 64, **kw), 64),
            ("Plain CNN, 6 convolutions and ReLU, 32 channels, 32x32, batch 16", lambda **kw: models.plain_cnn(6, 32, 32, 16, **kw), 6),
            ("MLP chain with dropout 0.1, 12 layers, width 256, batch 1024",
             lambda **kw: models.mlp_chain(12, 256, 1024, dropout=0.1, **kw), 12),
        ]
    if args.only:
        suite = [entry for entry in suite if any(word.lower() in entry[0].lower() for word in args.only)]
    report = [f"### jdtr.remat_grad vs jax.checkpoint, {datetime.date.today().isoformat()}", "",
              f"Machine: {machine()}. Compiled memory = XLA's arguments + outputs + temporaries; step time = median of "
              f"{args.repeats} interleaved runs; a built-in choice no larger and faster by less than {TIE:.0%} is a tie. Built-in choices compiled with `{NO_CSE}` (without it, XLA on the CPU "
              "undoes them); jdtr with default options.", ""]
    all_rows = []
    for name, factory, layers in suite:
        print(f"benchmarking {name} ...", file=sys.stderr)
        lines, rows = run(name, factory, layers, args.ratios, args.repeats, tune=not args.tuned_only)
        report += lines + [""]
        all_rows.append((name, rows))
        print("\n".join(lines), file=sys.stderr)
    text = "\n".join(report)
    print(text)
    write_report(args.output, text)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(all_rows), figsize=(6 * len(all_rows), 4.5), squeeze=False)
        for ax, (name, rows) in zip(axes[0], all_rows):
            for r in rows:
                jd = r["budget"] is not None
                ax.scatter(r["bytes"] / 2**20, r["time"] * 1e3, marker="o" if jd else "s", color="C3" if jd else "C0")
                ax.annotate(r["label"].replace("jdtr.remat_grad budget ", "jdtr ").replace(", autotune=False", " untuned"), (r["bytes"] / 2**20, r["time"] * 1e3), fontsize=7)
            ax.set_xlabel("compiled memory (MiB)")
            ax.set_ylabel("step time (ms)")
            ax.set_title(name, fontsize=9)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
