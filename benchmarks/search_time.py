"""Planning time where the search is long: tight budgets, errors, a transformer in `nnx.scan`.

Plans each model at each budget with `autotune=False` (the search alone:
DTR's simulations, the cuts, the candidates compiled), prints the seconds
and what was found, and writes every plan's `checkpoint_plan.layout` (its
gate, its tie, and its segments' ranges, saved value ids and nesting) and
every error's suggestion to `--dump` as JSON, so that two
versions of jdtr can be checked to plan the same: run it under each (for
example with `PYTHONPATH` at a checkout of the other) and compare the files.

    python benchmarks/search_time.py --dump /tmp/after.json [resnet transformer scan_tf]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp

import jdtr
from jdtr import models
from jdtr.transform.checkpoint_plan import layout


def scan_transformer():
    """8 blocks (LayerNorm, 4-head attention, MLP 64-256-64) in `nnx.scan`, batch 16 x 64 tokens."""
    import optax
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, d, rngs):
            self.ln = nnx.LayerNorm(d, rngs=rngs)
            self.f1, self.f2 = nnx.Linear(d, 4 * d, rngs=rngs), nnx.Linear(4 * d, d, rngs=rngs)
            self.att = nnx.MultiHeadAttention(4, d, decode=False, rngs=rngs)

        def __call__(self, x):
            x = x + self.att(self.ln(x))
            return x + self.f2(jax.nn.gelu(self.f1(x)))

    class Net(nnx.Module):
        def __init__(self, rngs, d=64, n=8):
            @nnx.split_rngs(splits=n)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make(rngs):
                return Block(d, rngs)

            self.blocks, self.head = make(rngs), nnx.Linear(d, 10, rngs=rngs)

        def __call__(self, x):
            @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
            def run(block, x):
                return block(x)

            return self.head(run(self.blocks, x).mean(1))

    graph, state = nnx.split(Net(nnx.Rngs(0)))
    x, y = jax.random.normal(jax.random.PRNGKey(1), (16, 64, 64)), jnp.arange(16) % 10
    loss = lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graph, p)(x), y).mean()  # noqa: E731
    return loss, (state, x, y), ("12MiB", 0.3, 0.2)


CASES = {
    "resnet": lambda: models.resnet(blocks=6, channels=16, image=16, batch=8),
    "transformer": lambda: models.transformer(blocks=4, dim=64, heads=2, seq=64, batch=8, vocab=64),
    "mlp": lambda: models.mlp_chain(layers=32, width=64, batch=512),
    "rnn": lambda: models.rnn(steps=32, hidden=64, features=16, batch=32),
    "rnn64": lambda: models.rnn(steps=64, hidden=32, features=8, batch=64),
    "lstm": lambda: models.flax_scan_lstm(steps=32, hidden=64, features=32, batch=16),
    "scan_gpt": lambda: models.flax_scan_gpt(layers=4, dim=32, seq=64, batch=4),
    "tied_lm": lambda: models.flax_tied_lm(),
}
# Budgets where the default ones do not say what is measured: where no
# scan strategy fits (the error path, its step's scans unrolled too).
BUDGETS = {"rnn64": (0.15,), "lstm": (0.3,), "scan_gpt": (0.2,), "tied_lm": (0.5, 0.9, 0.8)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["resnet", "transformer", "scan_tf"])
    parser.add_argument("--dump", help="a JSON file for the plans found")
    options = parser.parse_args()
    found = {}
    for name in options.models:
        if name == "scan_tf":
            loss, args, budgets = scan_transformer()
        else:
            m = CASES[name]()
            loss, args, budgets = m.loss, (m.params, m.batch), BUDGETS.get(name, (0.7, 0.5, 0.3, 0.15))
        for budget in budgets:
            start = time.perf_counter()
            try:
                plan = jdtr.plan(loss, *args, budget=budget, autotune=False)
                row = {"layout": layout(plan), "bytes": plan.compiled_bytes}
                said = f"{len(plan.segments)} segments, {plan.compiled_bytes} bytes"
            except jdtr.OutOfBudgetError as err:
                row = {"suggested": err.suggested_budget_bytes}
                said = f"OutOfBudgetError, suggests {err.suggested_budget_bytes} bytes"
            found[f"{name} {budget}"] = row
            print(f"{name} {budget}: {time.perf_counter() - start:.1f} s, {said}", flush=True)
    if options.dump:
        with open(options.dump, "w") as f:
            json.dump(found, f, sort_keys=True, default=lambda o: sorted(map(str, o)))  # (signatures: a frozenset)


if __name__ == "__main__":
    main()
