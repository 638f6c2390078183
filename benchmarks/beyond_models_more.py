"""More models of kinds the repository's own do not cover: the tenth round
of `beyond_models.py` (docs/benchmarks.md, "Models beyond the repository, a
tenth round"), registered in its `MODELS`.

Each is a few lines of plain JAX, written as a user would: a neural ODE
(`odeint`, whose derivative is a `custom_vjp` of `while_loop`s), a U-Net
with a bilinear `jax.image.resize`, spectral normalisation by a power
iteration in a `fori_loop`, causal linear attention by `cumsum`, graph
attention with a `segment_max` softmax, a `while_loop` on stopped
values, `jax.nn.dot_product_attention`, scans reversed, unrolled, without
inputs and around a `checkpoint` with a policy, and arguments that are
`flax.struct` dataclasses with a static field and a `None`.

    python benchmarks/beyond_models.py --models node unet specnorm
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

NHWC = ("NHWC", "HWIO", "NHWC")
KEY = jax.random.PRNGKey(10)


def _nrm(i: int, shape, scale: float = 1.0):
    return jax.random.normal(jax.random.fold_in(KEY, i), shape) * scale


def node():
    from jax.experimental.ode import odeint

    d, B = 64, 256
    ps = (_nrm(1, (d, d), d**-0.5), _nrm(2, (d, d), d**-0.5), _nrm(3, (d, 10), d**-0.5))
    y = jnp.arange(B) % 10

    def field(h, t, w1, w2):
        return jnp.tanh(jnp.tanh(h @ w1) @ w2)

    def loss(ps, x):
        w1, w2, wo = ps
        h = odeint(field, x, jnp.array([0.0, 1.0]), w1, w2, rtol=1e-3, atol=1e-3)[-1]
        return -jnp.mean(jax.nn.log_softmax(h @ wo)[jnp.arange(B), y])

    return "neural ODE (`odeint`, a 2-layer field of 64, batch 256)", loss, ps, _nrm(4, (B, d))


def unet():
    c = 16
    ps = {"d1": _nrm(10, (3, 3, 3, c), 0.2), "d2": _nrm(11, (3, 3, c, 2 * c), 0.1),
          "u1": _nrm(12, (3, 3, 3 * c, c), 0.1), "o": _nrm(13, (1, 1, c, 3), 0.2)}

    def conv(x, w, s=1):
        return lax.conv_general_dilated(x, w, (s, s), "SAME", dimension_numbers=NHWC)

    def loss(ps, x):
        h1 = jax.nn.gelu(conv(x, ps["d1"]))
        h2 = jax.nn.gelu(conv(h1, ps["d2"], 2))
        up = jax.image.resize(h2, (h2.shape[0], h1.shape[1], h1.shape[2], h2.shape[3]), "bilinear")
        h = jax.nn.gelu(conv(jnp.concatenate([up, h1], -1), ps["u1"]))
        return jnp.mean((conv(h, ps["o"]) - x) ** 2)

    return "U-Net (a strided convolution down, bilinear `resize` up, a skip; 32x32, batch 8)", loss, ps, _nrm(14, (8, 32, 32, 3))


def specnorm():
    d = 128
    ps = [_nrm(20 + i, (d, d), d**-0.5) for i in range(4)]

    def normalised(w):
        def power(_, u):
            v = w.T @ u
            u = w @ (v / jnp.linalg.norm(v))
            return u / jnp.linalg.norm(u)

        u = lax.stop_gradient(lax.fori_loop(0, 3, power, jnp.ones((d,)) / d**0.5))
        v = lax.stop_gradient(w.T @ u / jnp.linalg.norm(w.T @ u))
        return w / (u @ w @ v)

    def loss(ps, x):
        for w in ps:
            x = jax.nn.relu(x @ normalised(w))
        return jnp.mean(x**2)

    return "spectral normalisation (a power iteration in `fori_loop`, 4 layers of 128, batch 1024)", loss, ps, _nrm(25, (1024, d))


def linattn():
    B, T, d = 8, 128, 64
    ps = [_nrm(30 + i, (d, 3 * d), d**-0.5) for i in range(3)]

    def loss(ps, x):
        for w in ps:
            q, k, v = jnp.split(x @ w, 3, -1)
            q, k = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
            kv = jnp.cumsum(jnp.einsum("btd,bte->btde", k, v), axis=1)
            z = jnp.cumsum(k, axis=1)
            x = x + jnp.einsum("btd,btde->bte", q, kv) / (jnp.einsum("btd,btd->bt", q, z)[..., None] + 1e-6)
        return jnp.mean(x**2)

    return "causal linear attention (`cumsum` of key-value outer products, 3 layers, 128 steps, batch 8)", loss, ps, _nrm(35, (B, T, d))


def gat():
    N, E, d = 2048, 8192, 64
    src = jax.random.randint(jax.random.PRNGKey(1), (E,), 0, N)
    dst = jax.random.randint(jax.random.PRNGKey(2), (E,), 0, N)
    ps = [(_nrm(40 + i, (d, d), d**-0.5), _nrm(50 + i, (d,), 0.1)) for i in range(3)]

    def loss(ps, x):
        for w, a in ps:
            h = x @ w
            e = jax.nn.leaky_relu((h[src] * a).sum(-1) + (h[dst] * a).sum(-1))
            alpha = jnp.exp(e - jax.ops.segment_max(e, dst, N)[dst])
            alpha = alpha / (jax.ops.segment_sum(alpha, dst, N)[dst] + 1e-9)
            x = jax.nn.elu(jax.ops.segment_sum(alpha[:, None] * h[src], dst, N)) + x
        return jnp.mean(x**2)

    return "graph attention (a `segment_max` softmax over 8192 edges, 3 layers, 2048 nodes)", loss, ps, _nrm(45, (N, d))


def whileloop():
    d = 64
    ps = [_nrm(60 + i, (d, d), d**-0.5) for i in range(4)]

    def loss(ps, x):
        for w in ps:
            x = jnp.tanh(x @ w)
        target = lax.while_loop(lambda c: c[1] < 5, lambda c: (c[0] * 0.9, c[1] + 1), (lax.stop_gradient(x), 0))[0]
        return jnp.mean((x - target) ** 2)

    return "a `while_loop` on stopped values after 4 tanh layers of 64 (batch 512)", loss, ps, _nrm(69, (512, d))


def dpa():
    B, T, H, D = 4, 64, 4, 16
    d = H * D
    ps = [(_nrm(70 + i, (d, 3 * d), d**-0.5), _nrm(80 + i, (d, d), d**-0.5)) for i in range(3)]

    def loss(ps, x):
        for wq, wo in ps:
            q, k, v = (t.reshape(B, T, H, D) for t in jnp.split(x @ wq, 3, -1))
            a = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
            x = x + a.reshape(B, T, d) @ wo
        return jnp.mean(x**2)

    return "`jax.nn.dot_product_attention`, causal (3 layers, 4 heads of 16, 64 tokens, batch 4)", loss, ps, _nrm(89, (B, T, d))


def scans():
    d = 64
    ws = _nrm(90, (6, d, d), d**-0.5)

    def loss(ws, x):
        def cell(h, w):
            h = jnp.tanh(h @ w)
            return h, jnp.sum(h)

        h, sums = lax.scan(cell, x, ws, reverse=True, unroll=2)
        h, _ = lax.scan(lambda h, _: (jnp.sin(h), None), h, None, length=3)
        h, _ = lax.scan(jax.checkpoint(cell, policy=jax.checkpoint_policies.dots_saveable), h, ws)
        return jnp.mean(h**2) + jnp.mean(sums)

    return "scans: reversed and unrolled, without inputs, around a `checkpoint` with a policy (6 steps of 64, batch 256)", loss, ws, _nrm(91, (256, d))


def structs():
    import flax

    @flax.struct.dataclass
    class Layer:
        w: jax.Array
        b: jax.Array
        repeats: int = flax.struct.field(pytree_node=False, default=3)

    d = 64
    ps = {"first": Layer(_nrm(92, (d, d), d**-0.5), jnp.zeros(d)), "unused": None, "rest": [Layer(_nrm(93, (d, d), d**-0.5), jnp.ones(d))]}

    def loss(ps, x):
        for layer in [ps["first"], *ps["rest"]]:
            for _ in range(layer.repeats):
                x = jax.nn.gelu(x @ layer.w + layer.b)
        return jnp.mean(x**2)

    return "`flax.struct` arguments (a static field, a `None`; 2 layers of 64 applied 3 times, batch 256)", loss, ps, _nrm(94, (256, d))


MORE = {"node": node, "unet": unet, "specnorm": specnorm, "linattn": linattn, "gat": gat,
        "whileloop": whileloop, "dpa": dpa, "scans": scans, "structs": structs}
