"""Train a character-level GPT (flax.nnx + optax) on a small public-domain corpus under a budget.

The corpus is examples/data/corpus.txt (about 5 KB of public-domain poetry
and prose); tokens are its characters, and the last tenth is held out. The
model is a pre-norm decoder: token and position embeddings, causal
multi-head self-attention and GELU MLP blocks. The module is split once
into a static `nnx.GraphDef` and its parameters; every step differentiates
a pure loss of the parameters with `jdtr.value_and_grad` under `--budget`,
so the traced step is cached and reused (the GraphDef is part of the cache
key). After training, `--sample` characters are generated greedily.

    python examples/train_transformer.py --budget 0.4 --steps 300
"""

from __future__ import annotations

import argparse
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import BudgetMeter, Progress, add_budget_argument  # examples/_common.py
from flax import nnx

import jdtr

CORPUS = pathlib.Path(__file__).resolve().parent / "data" / "corpus.txt"


class Block(nnx.Module):
    def __init__(self, dim: int, heads: int, rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(dim, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(heads, dim, decode=False, rngs=rngs)
        self.ln2 = nnx.LayerNorm(dim, rngs=rngs)
        self.up = nnx.Linear(dim, 4 * dim, rngs=rngs)
        self.down = nnx.Linear(4 * dim, dim, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.attention(self.ln1(x), mask=mask)
        return x + self.down(nnx.gelu(self.up(self.ln2(x))))


class GPT(nnx.Module):
    def __init__(self, vocab: int, context: int, dim: int, heads: int, layers: int, rngs: nnx.Rngs):
        self.tokens = nnx.Embed(vocab, dim, rngs=rngs)
        self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(), (context, dim)))
        self.blocks = nnx.List([Block(dim, heads, rngs) for _ in range(layers)])
        self.ln_f = nnx.LayerNorm(dim, rngs=rngs)
        self.head = nnx.Linear(dim, vocab, rngs=rngs)

    def __call__(self, tokens):
        length = tokens.shape[-1]
        x = self.tokens(tokens) + self.positions[:length]
        mask = jnp.tril(jnp.ones((length, length), bool))  # causal: position t sees positions <= t
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


def loss_fn(params, graphdef, tokens):
    """Next-character cross-entropy; `graphdef` is static (hashable), `params` differentiated."""
    model = nnx.merge(graphdef, params)
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def load_corpus():
    text = CORPUS.read_text(encoding="utf-8")
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], np.int32)
    split = int(0.9 * len(ids))
    return chars, ids[:split], ids[split:]


def windows(ids: np.ndarray, rng: np.random.Generator, batch: int, length: int) -> jax.Array:
    starts = rng.integers(0, len(ids) - length, batch)
    return jnp.asarray(np.stack([ids[s : s + length] for s in starts]))


def generate(graphdef, params, prompt: list[int], count: int, context: int) -> list[int]:
    """Greedy decoding over a sliding window of `context` characters."""
    forward = jax.jit(lambda p, window: nnx.merge(graphdef, p)(window[None])[0])
    out = list(prompt)
    for _ in range(count):
        window = out[-context:]
        pad = context - len(window)  # left-padded so that every window has one shape (one compilation)
        logits = forward(params, jnp.asarray([window[0]] * pad + window, jnp.int32))
        out.append(int(jnp.argmax(logits[-1])))
    return out


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_budget_argument(parser, 0.4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=64, help="characters per training sequence")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--sample", type=int, default=120, help="characters to generate after training")
    parser.add_argument("--heuristic", default=jdtr.DEFAULT_HEURISTIC, choices=sorted(jdtr.HEURISTICS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    chars, train_ids, valid_ids = load_corpus()
    model = GPT(len(chars), args.context, args.dim, args.heads, args.layers, nnx.Rngs(args.seed))
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = optax.adam(args.lr)
    opt_state = optimizer.init(params)

    @jax.jit
    def update(params, opt_state, grads):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    step_fn = jdtr.value_and_grad(loss_fn, budget=args.budget, heuristic=args.heuristic, return_stats=True)
    rng = np.random.default_rng(args.seed)
    meter, progress = BudgetMeter(), Progress(args.steps)
    loss = float("nan")
    for step in range(1, args.steps + 1):
        tokens = windows(train_ids, rng, args.batch, args.context + 1)
        (loss_value, grads), stats = step_fn(params, graphdef, tokens)
        params, opt_state = update(params, opt_state, grads)
        loss = float(loss_value)
        meter.add(stats)
        progress(step, loss=loss)

    valid_loss = float(jax.jit(loss_fn, static_argnums=1)(params, graphdef, windows(valid_ids, rng, args.batch, args.context + 1)))
    if args.sample > 0:
        prompt = [chars.index(c) for c in "The "]
        text = "".join(chars[i] for i in generate(graphdef, params, prompt, args.sample, args.context))
        print("sample: " + text.replace("\n", " / "))
    print(
        f"{meter.report()}, final loss {loss:.4f}, validation loss {valid_loss:.4f}, "
        f"trace-cache hits {step_fn.cache_hits}/{args.steps}"
    )
    return loss


if __name__ == "__main__":
    main()
