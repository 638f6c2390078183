"""Reference models in plain JAX (`jdtr.models`' own): chains, convolutional
nets, a transformer, an RNN, a model under `shard_map`, layers of sorts, a
WaveNet for per-example gradients, and a graph network."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax import lax


@dataclass(frozen=True)
class Model:
    name: str
    loss: Callable[[Any, Any], jax.Array]
    params: Any
    batch: Any


Segment = Callable[[Callable], Callable]


def _apply_layers(layer: Callable, params: Sequence, x, segment: Optional[Segment], every: int):
    """Applies `layer` for each parameter set; with `segment` (e.g. a
    `jax.checkpoint`), each group of `every` layers is wrapped in it."""
    if segment is None:
        for p in params:
            x = layer(p, x)
        return x

    def group(ps, x):
        for p in ps:
            x = layer(p, x)
        return x

    for i in range(0, len(params), every):
        x = segment(group)(params[i : i + every], x)
    return x


def mlp_chain(
    layers: int = 64, width: int = 256, batch: int = 2048, seed: int = 0, segment: Optional[Segment] = None,
    every: int = 1, dropout: float = 0.0,
) -> Model:
    """A deep tanh MLP: the linear chain of Theorem 3.1 in practice.

    `segment` wraps each group of `every` layers (for comparisons with
    `jax.checkpoint`); by default the layers are plain. With `dropout`, each
    layer drops that fraction of its outputs, with the batch's key folded
    with a count of the layers (as `nnx.Rngs` draws its keys; the batch is
    then (inputs, key))."""
    keys = jax.random.split(jax.random.PRNGKey(seed), layers + 1)
    params = [jax.random.normal(k, (width, width), jnp.float32) / jnp.sqrt(width) for k in keys[:-1]]
    x = jax.random.normal(keys[-1], (batch, width), jnp.float32)
    if not dropout:
        def loss(params, x):
            h = _apply_layers(lambda w, h: jnp.tanh(h @ w), params, x, segment, every)
            return jnp.mean(h**2)

        return Model(f"mlp{layers}x{width}_b{batch}", loss, params, x)

    def layer(w, state):
        h, key, count = state
        h = jnp.tanh(h @ w)
        keep = jax.random.bernoulli(jax.random.fold_in(key, count), 1 - dropout, h.shape)
        return jnp.where(keep, h / (1 - dropout), 0), key, count + 1

    def loss(params, batch):
        x, key = batch
        h, _, _ = _apply_layers(layer, params, (x, key, jnp.uint32(0)), segment, every)
        return jnp.mean(h**2)

    return Model(f"mlp{layers}x{width}_b{batch}_dropout{dropout}", loss, params, (x, jax.random.PRNGKey(seed + 1)))


def _batch_norm(x, scale, bias, eps=1e-5):
    mean = jnp.mean(x, axis=(0, 1, 2))
    var = jnp.var(x, axis=(0, 1, 2))
    return (x - mean) * lax.rsqrt(var + eps) * scale + bias


def _conv(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _conv_init(key, cin: int, cout: int):
    """A 3x3 kernel, He-initialised."""
    return jax.random.normal(key, (3, 3, cin, cout), jnp.float32) * jnp.sqrt(2.0 / (9 * cin))


def _head_and_batch(keys, width: int, classes: int, batch: int, image: int):
    """A linear head's weights, then a batch of images and labels, from `keys` in that order."""
    head = jax.random.normal(next(keys), (width, classes), jnp.float32) / jnp.sqrt(width)
    images = jax.random.normal(next(keys), (batch, image, image, 3), jnp.float32)
    labels = jax.random.randint(next(keys), (batch,), 0, classes)
    return head, (images, labels)


def _classify(h, head, y):
    """Cross-entropy of a linear head on the mean-pooled feature map `h`."""
    logits = jnp.mean(h, axis=(1, 2)) @ head
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def resnet(
    blocks: int = 4,
    channels: int = 16,
    image: int = 16,
    batch: int = 8,
    classes: int = 10,
    seed: int = 0,
    segment: Optional[Segment] = None,
    every: int = 1,
) -> Model:
    """A residual CNN with batch norm (batch statistics), ReLU and a linear
    head; `segment` wraps each group of `every` blocks, as in `mlp_chain`."""
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 4 * blocks + 4))
    params = {
        "stem": _conv_init(next(keys), 3, channels),
        "blocks": [
            {
                "conv1": _conv_init(next(keys), channels, channels),
                "bn1": (jnp.ones(channels), jnp.zeros(channels)),
                "conv2": _conv_init(next(keys), channels, channels),
                "bn2": (jnp.ones(channels), jnp.zeros(channels)),
            }
            for _ in range(blocks)
        ],
    }
    params["head"], data = _head_and_batch(keys, channels, classes, batch, image)

    def loss(params, batch):
        x, y = batch
        h = _apply_layers(_residual_block, params["blocks"], jax.nn.relu(_conv(x, params["stem"])), segment, every)
        return _classify(h, params["head"], y)

    return Model(f"resnet{blocks}x{channels}_b{batch}", loss, params, data)


def plain_cnn(
    layers: int = 6,
    channels: int = 32,
    image: int = 32,
    batch: int = 16,
    classes: int = 10,
    seed: int = 0,
    segment: Optional[Segment] = None,
    every: int = 1,
    pools: Sequence[int] = (),
) -> Model:
    """3x3 convolutions with ReLU and no normalisation or skip connections,
    mean-pooled into a linear head; `segment` as in `mlp_chain`. After each
    layer whose index is in `pools`, a 2x2 max pool halves the image and
    the next convolution doubles the channels (VGG-like)."""
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), layers + 3))
    widths, width = [], channels
    for i in range(layers):
        widths.append(width)
        if i in pools:
            width *= 2
    kernels = [_conv_init(next(keys), 3 if i == 0 else widths[i - 1], cout) for i, cout in enumerate(widths)]
    head, data = _head_and_batch(keys, widths[-1], classes, batch, image)
    # A pool is an entry with no arrays in the list of layers, so that it
    # stays a Python value through `segment` (a `jax.checkpoint`).
    for i in sorted(pools, reverse=True):
        kernels.insert(i + 1, ())
    params = {"convs": kernels, "head": head}

    def layer(p, h):
        if isinstance(p, tuple):
            return lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return jax.nn.relu(_conv(h, p))

    def loss(params, batch):
        x, y = batch
        return _classify(_apply_layers(layer, params["convs"], x, segment, every), params["head"], y)

    name = f"plain_cnn{layers}x{channels}_b{batch}" + (f"_pool{'-'.join(map(str, pools))}" if pools else "")
    return Model(name, loss, params, data)


def _residual_block(p, h):
    r = jax.nn.relu(_batch_norm(_conv(h, p["conv1"]), *p["bn1"]))
    r = _batch_norm(_conv(r, p["conv2"]), *p["bn2"])
    return jax.nn.relu(h + r)


def _layer_norm(x, scale, bias, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * scale + bias


def transformer(
    blocks: int = 4,
    dim: int = 64,
    heads: int = 4,
    seq: int = 32,
    batch: int = 4,
    vocab: int = 128,
    seed: int = 0,
    segment: Optional[Segment] = None,
    every: int = 1,
) -> Model:
    """A pre-norm decoder: causal self-attention, layer norm, GELU MLP.

    `segment` wraps each group of `every` blocks (see `mlp_chain`)."""
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 6 * blocks + 4))

    def dense(i, o):
        return jax.random.normal(next(keys), (i, o), jnp.float32) / jnp.sqrt(i)

    params = {
        "embed": jax.random.normal(next(keys), (vocab, dim), jnp.float32) * 0.02,
        "blocks": [
            {
                "ln1": (jnp.ones(dim), jnp.zeros(dim)),
                "qkv": dense(dim, 3 * dim),
                "proj": dense(dim, dim),
                "ln2": (jnp.ones(dim), jnp.zeros(dim)),
                "up": dense(dim, 4 * dim),
                "down": dense(4 * dim, dim),
            }
            for _ in range(blocks)
        ],
        "ln_f": (jnp.ones(dim), jnp.zeros(dim)),
    }
    tokens = jax.random.randint(next(keys), (batch, seq + 1), 0, vocab)

    def attention(x, p):
        b, t, d = x.shape
        q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)
        split = lambda a: a.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(d // heads)
        mask = jnp.tril(jnp.ones((t, t), bool))
        scores = jnp.where(mask, scores, -1e9)
        out = jax.nn.softmax(scores, axis=-1) @ v
        return out.transpose(0, 2, 1, 3).reshape(b, t, d) @ p["proj"]

    def block(p, x):
        x = x + attention(_layer_norm(x, *p["ln1"]), p)
        return x + jax.nn.gelu(_layer_norm(x, *p["ln2"]) @ p["up"]) @ p["down"]

    def loss(params, tokens):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        x = params["embed"][inputs]
        x = _apply_layers(block, params["blocks"], x, segment, every)
        logits = _layer_norm(x, *params["ln_f"]) @ params["embed"].T
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    return Model(f"transformer{blocks}x{dim}_s{seq}_b{batch}", loss, params, tokens)


def rnn(
    steps: int = 32,
    hidden: int = 64,
    features: int = 16,
    batch: int = 8,
    seed: int = 0,
    segment: Optional[Segment] = None,
    every: int = 1,
) -> Model:
    """A tanh RNN over time written with `lax.scan` (kept whole, under a
    scan strategy, by `jdtr.grad`'s and `jdtr.plan`'s plans).

    `segment` wraps each group of `every` steps, as `jax.checkpoint` is used
    with scans: the step function itself (every=1), or a scan over groups
    whose body scans `every` steps (sqrt(T) checkpointing, `every` dividing
    `steps`)."""
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(seed), 4)
    params = {
        "w_in": jax.random.normal(k1, (features, hidden), jnp.float32) / jnp.sqrt(features),
        "w_h": jax.random.normal(k2, (hidden, hidden), jnp.float32) / jnp.sqrt(hidden),
        "w_out": jax.random.normal(k3, (hidden, 1), jnp.float32) / jnp.sqrt(hidden),
    }
    xs = jax.random.normal(k4, (steps, batch, features), jnp.float32)

    def loss(params, xs):
        def cell(h, x):
            h = jnp.tanh(x @ params["w_in"] + h @ params["w_h"])
            return h, h @ params["w_out"]

        h0 = jnp.zeros((xs.shape[1], params["w_h"].shape[0]))
        if segment is None:
            _, ys = lax.scan(cell, h0, xs)
        elif every == 1:
            _, ys = lax.scan(segment(cell), h0, xs)
        else:
            group = segment(lambda h, chunk: lax.scan(cell, h, chunk))
            _, ys = lax.scan(group, h0, xs.reshape(xs.shape[0] // every, every, *xs.shape[1:]))
            ys = ys.reshape(xs.shape[0], *ys.shape[2:])
        return jnp.mean(ys**2)

    return Model(f"rnn{steps}x{hidden}_b{batch}", loss, params, xs)


def stacked_lstm(layers: int = 4, steps: int = 32, hidden: int = 32, batch: int = 16, seed: int = 3) -> Model:
    """A stacked LSTM as JAX users write one: a `lax.scan` over the layers'
    stacked weights whose body is a `lax.scan` over time (scans nested in
    a kept scan's body, run under its strategy where it alone cannot fit)."""
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = (
        jax.random.normal(k[0], (layers, hidden, 4 * hidden), jnp.float32) * hidden**-0.5,
        jax.random.normal(k[1], (layers, hidden, 4 * hidden), jnp.float32) * hidden**-0.5,
    )
    seq = jax.random.normal(k[2], (steps, batch, hidden), jnp.float32)

    def loss(params, seq):
        def layer(seq, weights):
            w, u = weights

            def cell(h_c, x):
                h, c = h_c
                i, f, g, o = jnp.split(x @ w + h @ u, 4, -1)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                h = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (h, c), h

            zeros = jnp.zeros(seq.shape[1:], seq.dtype)
            return lax.scan(cell, (zeros, zeros), seq)[1], None

        return jnp.mean(lax.scan(layer, seq, params)[0] ** 2)

    return Model(f"stacked_lstm{layers}x{steps}x{hidden}_b{batch}", loss, params, seq)


def gated_mlp(blocks: int = 16, width: int = 256, batch: int = 1024, seed: int = 0) -> Model:
    """A residual tanh MLP whose blocks the data switches on and off: block
    i runs (two layers) where the batch's gate i is positive, else a cheap
    scaling, by `lax.cond` on data (layer drop, as in stochastic depth, with
    the draw as an input). The batch is `(x, gates)`; `gates` pick the path."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 2 * blocks + 2)
    params = [
        (jax.random.normal(a, (width, width)) / jnp.sqrt(width), jax.random.normal(b, (width, width)) / jnp.sqrt(width))
        for a, b in zip(keys[0 : 2 * blocks : 2], keys[1 : 2 * blocks : 2])
    ]
    x = jax.random.normal(keys[-2], (batch, width), jnp.float32)
    gates = jnp.where(jnp.arange(blocks) % 3 == 2, -1.0, 1.0)  # every third block dropped

    def loss(params, batch):
        h, gates = batch
        for (w1, w2), gate in zip(params, gates):
            h = lax.cond(gate > 0, lambda a: a + jnp.tanh(jnp.tanh(a @ w1) @ w2), lambda a: a * 0.9, h)
        return jnp.mean(h**2)

    return Model(f"gated_mlp{blocks}x{width}_b{batch}", loss, params, (x, gates))


def linear_recurrence(layers: int = 4, steps: int = 256, width: int = 64, batch: int = 8, seed: int = 0) -> Model:
    """Residual layers of a diagonal linear recurrence, h_t = a * h_(t-1) + x_t W,
    computed in parallel over time by `lax.associative_scan` (as in S5 or the
    LRU), then tanh: about 350 short equations a layer (slices, pads and
    elementwise products of the scan's levels), so a step is many cheap
    operations, where dispatches and the arrays between programs show."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 2 * layers + 1)
    params = [
        (jax.random.uniform(a, (width,), minval=0.5, maxval=0.99), jax.random.normal(w, (width, width)) / jnp.sqrt(width))
        for a, w in zip(keys[0 : 2 * layers : 2], keys[1 : 2 * layers : 2])
    ]
    x = jax.random.normal(keys[-1], (batch, steps, width), jnp.float32)

    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]

    def loss(params, x):
        for a, w in params:
            u = x @ w
            _, h = lax.associative_scan(combine, (jnp.broadcast_to(a, u.shape), u), axis=1)
            x = x + jnp.tanh(h)
        return jnp.mean(x**2)

    return Model(f"linear_recurrence{layers}x{width}_t{steps}_b{batch}", loss, params, x)


def fourier_operator(layers: int = 4, batch: int = 16, points: int = 256, channels: int = 32, modes: int = 16, seed: int = 0) -> Model:
    """A Fourier neural operator's layers: rfft along the points, a complex
    mixing of the lowest `modes`, irfft, beside a pointwise linear map, then
    GELU. Complex weights and FFTs, whose compiled bytes leave the memory
    model's order."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 2 * layers + 1)
    params = [
        (jax.random.normal(s, (channels, channels, modes), jnp.complex64) / channels,
         jax.random.normal(w, (channels, channels)) / jnp.sqrt(channels))
        for s, w in zip(keys[0 : 2 * layers : 2], keys[1 : 2 * layers : 2])
    ]
    x = jax.random.normal(keys[-1], (batch, points, channels), jnp.float32)

    def loss(params, x):
        for spectral, pointwise in params:
            low = jnp.fft.rfft(x, axis=1)[:, :modes]
            mixed = jnp.einsum("bmi,iom->bmo", low, spectral)
            y = jnp.fft.irfft(jnp.pad(mixed, ((0, 0), (0, points // 2 + 1 - modes), (0, 0))), n=points, axis=1)
            x = jax.nn.gelu(y + x @ pointwise)
        return jnp.mean(x**2)

    return Model(f"fourier_operator{layers}x{channels}_n{points}_m{modes}_b{batch}", loss, params, x)


def megatron_shard_map(mesh: Any, layers: int = 4, width: int = 128, batch: int = 2048, seed: int = 0) -> Model:
    """A loss written as one `shard_map` over a mesh with axes "data" and
    "model": Megatron-style layers (a column-sharded then a row-sharded
    matmul, a `psum` over "model"), each normalised with a `psum` over
    "data"; params and batch placed on `mesh` as the specs say."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:  # pragma: no cover - JAX before 0.7
        from jax.experimental.shard_map import shard_map
    data = mesh.shape["data"]
    specs = (P(None, "model"), P("model", None))
    keys = jax.random.split(jax.random.PRNGKey(seed), 2 * layers + 1)
    params = [
        tuple(jax.device_put(jax.random.normal(keys[2 * i + j], (width, width)) / jnp.sqrt(width), NamedSharding(mesh, s))
              for j, s in enumerate(specs))
        for i in range(layers)
    ]
    x = jax.device_put(jax.random.normal(keys[-1], (batch, width)), NamedSharding(mesh, P("data")))

    def layer(w, h):
        h = lax.psum(jnp.tanh(h @ w[0]) @ w[1], "model")
        return h * lax.rsqrt(lax.psum(jnp.mean(h * h), "data") / data + 1.0)

    def body(params, x):
        for w in params:
            x = layer(w, x)
        return x

    def loss(params, x):
        in_specs = ([specs] * len(params), P("data"))
        return jnp.mean(shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=P("data"))(params, x) ** 2)

    return Model(f"megatron_shard_map{layers}x{width}_b{batch}", loss, params, x)


def sorted_layers(layers: int = 6, batch: int = 512, width: int = 128, k: int = 16, seed: int = 2) -> Model:
    """Layers of matmul, tanh, a sort along the features, `top_k` and a
    softmax gate: a program whose costliest operations (the sorts, most of
    the step on the CPU) make no residual of their own (their derivative
    reads the permutation), for `costly.py`'s candidate."""
    keys = jax.random.split(jax.random.PRNGKey(seed), layers + 1)
    params = [jax.random.normal(key, (width, width)) / width**0.5 for key in keys[:-1]]
    x = jax.random.normal(keys[-1], (batch, width))

    def loss(params, x):
        h = x
        for w in params:
            h = jnp.sort(jnp.tanh(h @ w), axis=-1)
            top, _ = lax.top_k(h, k)
            h = h + jnp.mean(top, -1, keepdims=True)
            h = h * jax.nn.softmax(h, -1)
        return jnp.mean(h**2)

    return Model(f"sorted_layers{layers}x{width}_b{batch}", loss, params, x)


def wavenet(layers: int = 8, channels: int = 32, length: int = 2048, examples: int = 8, seed: int = 0) -> Model:
    """A WaveNet for per-example gradients: `layers` dilated causal 1-D
    convolutions (dilation 2^i) with gated activations and residual 1x1
    convolutions, predicting the next sample. `loss(params, x)` is one
    example's; the batch holds `examples` of them along its first axis
    (`jax.vmap(..., in_axes=(None, 0))`), each 4 sequences of `length`."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 2 * layers + 3)
    c = channels
    params = {
        "in": jax.random.normal(keys[0], (2, 1, c)) * 0.5,
        "layers": [
            {"f": jax.random.normal(keys[1 + 2 * i], (2, c, 2 * c)) / (2 * c) ** 0.5,
             "r": jax.random.normal(keys[2 + 2 * i], (1, c, c)) / c**0.5}
            for i in range(layers)
        ],
        "out": jax.random.normal(keys[-2], (c, 1)) / c**0.5,
    }
    xs = jax.random.normal(keys[-1], (examples, 4, length, 1))

    def causal(x, w, dilation):
        x = jnp.pad(x, ((0, 0), ((w.shape[0] - 1) * dilation, 0), (0, 0)))
        return lax.conv_general_dilated(x, w, (1,), "VALID", rhs_dilation=(dilation,), dimension_numbers=("NWC", "WIO", "NWC"))

    def loss(p, x):
        h = causal(x, p["in"], 1)
        for i, layer in enumerate(p["layers"]):
            z = causal(h, layer["f"], 2**i)
            h = h + causal(jnp.tanh(z[..., :c]) * jax.nn.sigmoid(z[..., c:]), layer["r"], 1)
        return jnp.mean(((h @ p["out"])[:, :-1] - x[:, 1:]) ** 2)

    return Model(f"wavenet{layers}x{channels}_l{length}_e{examples}", loss, params, xs)


def message_passing(layers: int = 6, nodes: int = 4096, edges: int = 32768, dim: int = 64, seed: int = 0) -> Model:
    """A graph network: each layer gathers its nodes' features along random
    edges, sums them at the receivers (`jax.ops.segment_sum`: a scatter-add)
    and updates every node with a GELU layer of its features and messages.
    The batch is (features, senders, receivers). The gathered messages (edges
    x dim) are the step's largest values, and XLA fuses them into the scatter."""
    keys = jax.random.split(jax.random.PRNGKey(seed), layers + 3)
    params = [jax.random.normal(k, (2 * dim, dim)) / (2 * dim) ** 0.5 for k in keys[:layers]]
    x = jax.random.normal(keys[-1], (nodes, dim))
    senders, receivers = (jax.random.randint(k, (edges,), 0, nodes) for k in keys[layers : layers + 2])

    def loss(params, batch):
        h, senders, receivers = batch
        for w in params:
            messages = jax.ops.segment_sum(h[senders], receivers, num_segments=nodes) * (nodes / edges)
            h = h + 0.1 * jax.nn.gelu(jnp.concatenate([h, messages], -1) @ w)
        return jnp.mean(h**2)

    return Model(f"message_passing{layers}x{dim}_n{nodes}_e{edges}", loss, params, (x, senders, receivers))
