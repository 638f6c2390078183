"""Models of kinds the repository's own do not cover, side by side with
`jax.jit(jax.grad)` (issues 21 and 22; docs/benchmarks.md, "Models beyond
the repository", third, fourth, seventh to tenth rounds).

Each is a few lines of plain JAX, written as a user would, none of them
shaped for jdtr. Per model, in one process: `jax.jit(jax.grad)`;
`jdtr.grad` at 1.0 and 0.5 of its peak (`chunks="always"`, timed from
its fourth call); and `jax.jit(jdtr.remat_grad(loss, budget=0.5))` with
its compiled bytes over `jax.jit(jax.grad)`'s. Ratios are medians of
`--repeats` interleaved runs; the last column is the largest error of
any gradient against `jax.jit(jax.grad)`'s, relative to its largest entry.

    python benchmarks/beyond_models.py --models fno gp decoder
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jdtr

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from remat_benchmark import compiled  # noqa: E402
from scan_benchmark import interleaved_medians  # noqa: E402
from slack_benchmark import report  # noqa: E402
from beyond_models_more import MORE  # noqa: E402

KEYS = jax.random.split(jax.random.PRNGKey(0), 8)
NHWC = ("NHWC", "HWIO", "NHWC")


def _normal(k: int, i: int, shape, scale: float = 1.0, dtype=jnp.float32):
    return jax.random.normal(jax.random.fold_in(KEYS[k], i), shape, dtype) * scale


def _nrm(i: int, shape, scale: float = 1.0):
    return _normal(7, i, shape, scale)


def depthwise():
    c = 32
    ps = [(_normal(0, i, (3, 3, 1, c), 1 / 3), _normal(1, i, (1, 1, c, c), c**-0.5)) for i in range(6)]

    def loss(ps, x):
        for dw, pw in ps:
            h = jax.nn.relu(lax.conv_general_dilated(x, dw, (1, 1), "SAME", dimension_numbers=NHWC, feature_group_count=c))
            x = x + lax.conv_general_dilated(h, pw, (1, 1), "SAME", dimension_numbers=NHWC)
        return jnp.mean(x**2)

    return "depthwise-separable CNN (6 blocks, 32 channels, 32x32, batch 16)", loss, ps, _normal(2, 0, (16, 32, 32, c))


def attention():
    d, t, b, heads = 64, 128, 8, 4
    ps = [_normal(0, i, (d, 3 * d), d**-0.5) for i in range(4)]

    def loss(ps, x):
        for w in ps:
            q, k, v = jnp.split(x @ w, 3, axis=-1)
            split = lambda a: a.reshape(b, t, heads, d // heads)  # noqa: E731
            x = x + jax.nn.dot_product_attention(split(q), split(k), split(v), is_causal=True).reshape(b, t, d)
        return jnp.mean(x**2)

    return "`jax.nn.dot_product_attention`, causal (4 layers, 128 tokens, 64 wide, batch 8)", loss, ps, _normal(2, 0, (b, t, d))


def mapped():
    ws = [_normal(0, i, (128, 128), 1 / 11) for i in range(6)]

    def loss(ws, x):
        def row(r):
            for w in ws:
                r = jnp.tanh(r @ w)
            return jnp.sum(r**2)

        return jnp.mean(lax.map(row, x, batch_size=128))

    return "`lax.map` with `batch_size` (6 layers, 128 wide, 1024 rows in 8 batches)", loss, ws, _normal(2, 0, (1024, 128))


def user_remat():
    ws = [_normal(0, i, (256, 256), 1 / 16) for i in range(12)]
    block = jax.checkpoint(lambda w, h: jnp.tanh(jnp.tanh(h @ w) @ w), policy=jax.checkpoint_policies.dots_saveable)

    def loss(ws, x):
        for w in ws:
            x = block(w, x)
        return jnp.mean(x**2)

    return "the user's own `jax.checkpoint` (`dots_saveable`) per block (12 blocks, 256 wide)", loss, ws, _normal(2, 0, (1024, 256))


def recurrence(batch: int):
    def build():
        made = jdtr.models.linear_recurrence(layers=4, steps=256, width=64, batch=batch)
        return f"linear recurrence by `lax.associative_scan` (4 layers, 256 steps, 64 wide, batch {batch})", made.loss, made.params, made.batch

    return build


def fno():
    made = jdtr.models.fourier_operator(layers=4, batch=16, points=256, channels=32, modes=16)
    label = "Fourier neural operator (4 layers: rfft, complex mixing of 16 modes, irfft; 32 channels, 256 points, batch 16)"
    return label, made.loss, made.params, made.batch


def gp():
    n, d = 256, 8
    x = _normal(0, 0, (n, d))
    y = jnp.sin(x[:, 0]) + 0.1 * _normal(1, 0, (n,))
    ps = {"ls": jnp.zeros(d), "amp": jnp.array(0.0), "noise": jnp.array(-2.0)}

    def loss(ps, x):
        z = x / jnp.exp(ps["ls"])
        d2 = jnp.sum(z**2, 1)[:, None] + jnp.sum(z**2, 1)[None] - 2 * z @ z.T
        k = jnp.exp(ps["amp"]) * jnp.exp(-0.5 * d2) + (jnp.exp(ps["noise"]) + 1e-4) * jnp.eye(n)
        chol = jnp.linalg.cholesky(k)
        alpha = jax.scipy.linalg.cho_solve((chol, True), y)
        return 0.5 * y @ alpha + jnp.sum(jnp.log(jnp.diag(chol)))

    return "Gaussian process marginal likelihood (n=256: Cholesky, `cho_solve`)", loss, ps, x


def bf16():
    ws = [_normal(0, i, (256, 256), 1 / 16) for i in range(12)]

    def loss(ws, x):
        h = x.astype(jnp.bfloat16)
        for w in ws:
            h = jax.nn.gelu(h @ w.astype(jnp.bfloat16))
        return jnp.mean(h.astype(jnp.float32) ** 2)

    return "bf16 MLP with f32 parameters (12 layers, 256 wide, batch 2048)", loss, ws, _normal(2, 0, (2048, 256))


def vit():
    b, p, d = 8, 4, 64
    ps = {
        "patch": _normal(0, 0, (p, p, 3, d), 1 / 7),
        "blocks": [(_normal(1, i, (d, 3 * d), 1 / 8), _normal(2, i, (d, 4 * d), 1 / 8), _normal(3, i, (4 * d, d), 1 / 16)) for i in range(4)],
    }

    def loss(ps, x):
        h = lax.conv_general_dilated(x, ps["patch"], (p, p), "VALID", dimension_numbers=NHWC).reshape(b, -1, d)
        for qkv, up, down in ps["blocks"]:
            normed = (h - h.mean(-1, keepdims=True)) / (h.std(-1, keepdims=True) + 1e-5)
            q, k, v = jnp.split(normed @ qkv, 3, -1)
            h = h + jnp.einsum("bts,bsd->btd", jax.nn.softmax(jnp.einsum("btd,bsd->bts", q, k) / 8.0, -1), v)
            h = h + jax.nn.gelu(h @ up) @ down
        return jnp.mean(h.mean(1) ** 2)

    return "ViT (patch convolution, 64 tokens, 4 blocks of 64 wide, batch 8)", loss, ps, _normal(4, 0, (b, 32, 32, 3))


def pooling():
    ps = [_normal(0, i, (3, 3, 16 if i else 3, 16), 1 / 6) for i in range(4)]

    def loss(ps, x):
        for w in ps:
            x = jax.nn.relu(lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC))
            if x.shape[1] > 8:
                x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return jnp.mean(x**2)

    return "CNN with max pooling (`reduce_window`; 4 convolutions of 16 channels, 64x64, batch 16)", loss, ps, _normal(2, 0, (16, 64, 64, 3))


def decoder():
    ps = [_normal(0, i, (3, 3, 8, 8), 1 / 5) for i in range(4)]

    def loss(ps, x):
        for w in ps:
            b, h, wd, c = x.shape
            x = jax.image.resize(x, (b, min(2 * h, 64), min(2 * wd, 64), c), "bilinear")
            x = jax.nn.relu(lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC))
        return jnp.mean(x**2)

    return "upsampling decoder (`jax.image.resize` bilinear, 4 convolutions, 16x16 to 64x64, batch 8)", loss, ps, _normal(2, 0, (8, 16, 16, 8))


def fori():
    w = _normal(0, 0, (128, 128), 1 / 11)

    def loss(w, x):
        return jnp.mean(lax.fori_loop(0, 16, lambda i, h: jnp.tanh(h @ w) + 0.1 * h, x) ** 2)

    return "`lax.fori_loop` of 16 steps over shared weights (128 wide, batch 1024)", loss, w, _normal(2, 0, (1024, 128))


def mixer():
    b, t, c = 32, 64, 128
    ps = [
        (_normal(0, i, (t, 2 * t), t**-0.5), _normal(1, i, (2 * t, t), (2 * t) ** -0.5),
         _normal(2, i, (c, 4 * c), c**-0.5), _normal(3, i, (4 * c, c), (4 * c) ** -0.5))
        for i in range(6)
    ]

    def norm(h):
        return (h - h.mean(-1, keepdims=True)) * lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)

    def loss(ps, x):
        for t1, t2, c1, c2 in ps:
            x = x + (jax.nn.gelu(norm(x).swapaxes(1, 2) @ t1) @ t2).swapaxes(1, 2)
            x = x + jax.nn.gelu(norm(x) @ c1) @ c2
        return jnp.mean(x**2)

    return "MLP-Mixer (6 blocks, 64 tokens, 128 channels, batch 32)", loss, ps, _normal(4, 0, (b, t, c))


def wavenet():
    c, nwc = 32, ("NWC", "WIO", "NWC")
    ps = [(_normal(0, i, (2, c, 2 * c), (2 * c) ** -0.5), _normal(1, i, (1, c, c), c**-0.5)) for i in range(8)]

    def loss(ps, x):
        for i, (dilated, mix) in enumerate(ps):
            d = 2**i
            causal = jnp.pad(x, ((0, 0), (d, 0), (0, 0)))
            a, g = jnp.split(lax.conv_general_dilated(causal, dilated, (1,), "VALID", rhs_dilation=(d,), dimension_numbers=nwc), 2, -1)
            x = x + lax.conv_general_dilated(jnp.tanh(a) * jax.nn.sigmoid(g), mix, (1,), "VALID", dimension_numbers=nwc)
        return jnp.mean(x**2)

    return "WaveNet (8 dilated causal conv layers, gated, 32 channels, 2048 steps, batch 8)", loss, ps, _normal(4, 0, (8, 2048, c))


def convnext():
    c = 32
    ps = [(_normal(0, i, (7, 7, 1, c), 1 / 7), _normal(1, i, (c, 4 * c), c**-0.5), _normal(2, i, (4 * c, c), (4 * c) ** -0.5)) for i in range(4)]

    def loss(ps, x):
        for dw, up, down in ps:
            h = lax.conv_general_dilated(x, dw, (1, 1), "SAME", dimension_numbers=NHWC, feature_group_count=c)
            h = (h - h.mean(-1, keepdims=True)) * lax.rsqrt(h.var(-1, keepdims=True) + 1e-6)
            x = x + jax.nn.gelu(h @ up) @ down
        return jnp.mean(x**2)

    return "ConvNeXt blocks (7x7 depthwise, LayerNorm, 4x MLP; 4 blocks, 32 channels, 32x32, batch 16)", loss, ps, _normal(4, 0, (16, 32, 32, c))


def triplet():
    ws = [_normal(0, i, (128, 128), 128**-0.5) for i in range(6)]

    def encode(ws, x):
        for w in ws:
            x = jax.nn.gelu(x @ w)
        return x

    def loss(ws, x):
        a, p, n = encode(ws, x[0]), encode(ws, x[1]), encode(ws, x[2])
        return jnp.mean(jax.nn.relu(jnp.sum((a - p) ** 2, -1) - jnp.sum((a - n) ** 2, -1) + 1.0))

    return "triplet loss, one encoder run on three inputs (6 layers, 128 wide, batch 1024)", loss, ws, _normal(4, 0, (3, 1024, 128))


def gru():
    d, b = 128, 64
    ps = {"wx": _normal(0, 0, (d, 3 * d), d**-0.5), "wh": _normal(1, 0, (d, 3 * d), d**-0.5), "out": _normal(2, 0, (d, d), d**-0.5)}

    def loss(ps, xs):
        def cell(h, x):
            rx, zx, nx = jnp.split(x @ ps["wx"], 3, -1)
            rh, zh, nh = jnp.split(h @ ps["wh"], 3, -1)
            r, z = jax.nn.sigmoid(rx + rh), jax.nn.sigmoid(zx + zh)
            h = (1 - z) * jnp.tanh(nx + r * nh) + z * h
            return h, h

        _, hs = lax.scan(cell, jnp.zeros((b, d)), xs)
        return jnp.mean((hs @ ps["out"]) ** 2)

    return "GRU by `lax.scan` (64 steps, 128 wide, batch 64)", loss, ps, _normal(4, 0, (64, b, d))


def vae():
    d, h, z = 128, 128, 32
    sizes = {"e1": (d, h), "e2": (h, h), "mu": (h, z), "logvar": (h, z), "d1": (z, h), "d2": (h, h), "out": (h, d)}
    ps = {name: _normal(0, i, shape, shape[0] ** -0.5) for i, (name, shape) in enumerate(sizes.items())}

    def loss(ps, batch):
        x, key = batch
        e = jax.nn.relu(jax.nn.relu(x @ ps["e1"]) @ ps["e2"])
        mu, logvar = e @ ps["mu"], e @ ps["logvar"]
        latent = mu + jnp.exp(0.5 * logvar) * jax.random.normal(key, mu.shape)
        logits = jax.nn.relu(jax.nn.relu(latent @ ps["d1"]) @ ps["d2"]) @ ps["out"]
        reconstruction = jnp.sum(jnp.logaddexp(0.0, logits) - x * logits, -1)
        kl = -0.5 * jnp.sum(1 + logvar - mu**2 - jnp.exp(logvar), -1)
        return jnp.mean(reconstruction + kl)

    x = jax.nn.sigmoid(_normal(4, 0, (1024, d)))
    return "VAE, an MLP reparameterised from a key argument (128-128-128-32, batch 1,024)", loss, ps, (x, jax.random.PRNGKey(3))


# The eighth round's (docs/benchmarks.md): flows, rendering, selective scans, latents, routing, hypernetworks.

def realnvp():
    d, h, n = 64, 256, 6
    def mlp_params(i):
        return dict(w1=_nrm(10*i, (d, h), d**-.5), b1=jnp.zeros(h), w2=_nrm(10*i+1, (h, h), h**-.5), b2=jnp.zeros(h),
                    ws=_nrm(10*i+2, (h, d), 0.01), wt=_nrm(10*i+3, (h, d), 0.01))
    ps = [mlp_params(i) for i in range(n)]
    masks = [jnp.arange(d) % 2 == (i % 2) for i in range(n)]
    def loss(ps, x):
        logdet = 0.0
        for p, m in zip(ps, masks):
            xm = jnp.where(m, x, 0.0)
            hh = jax.nn.relu(xm @ p["w1"] + p["b1"]); hh = jax.nn.relu(hh @ p["w2"] + p["b2"])
            s = jnp.tanh(hh @ p["ws"]); t = hh @ p["wt"]
            s = jnp.where(m, 0.0, s); t = jnp.where(m, 0.0, t)
            x = x * jnp.exp(s) + t
            logdet = logdet + s.sum(-1)
        return jnp.mean(0.5 * (x**2).sum(-1) - logdet)
    return "RealNVP (6 affine couplings, 64-d, MLP 256, batch 1024)", loss, ps, _nrm(99, (1024, d))

def nerf():
    L, h, S, R = 8, 128, 32, 512
    def enc(x):
        f = 2.0 ** jnp.arange(6)
        xf = x[..., None] * f
        return jnp.concatenate([x, jnp.sin(xf).reshape(*x.shape[:-1], -1), jnp.cos(xf).reshape(*x.shape[:-1], -1)], -1)
    din = 3 + 3 * 12
    ps = dict(w=[_nrm(i, (din if i == 0 else (h + din if i == 4 else h), h), (h) ** -.5) for i in range(L)],
              sig=_nrm(50, (h, 1), 0.1), rgb=_nrm(51, (h, 3), 0.1))
    def loss(ps, rays):
        o, dvec, target = rays[:, :3], rays[:, 3:6], rays[:, 6:9]
        tvals = jnp.linspace(0.1, 4.0, S)
        pts = o[:, None, :] + dvec[:, None, :] * tvals[None, :, None]
        e = enc(pts)
        hh = e
        for i, w in enumerate(ps["w"]):
            if i == 4:
                hh = jnp.concatenate([hh, e], -1)
            hh = jax.nn.relu(hh @ w)
        sigma = jax.nn.softplus((hh @ ps["sig"])[..., 0])
        rgb = jax.nn.sigmoid(hh @ ps["rgb"])
        delta = jnp.diff(tvals, append=tvals[-1:] + 1e3)
        alpha = 1 - jnp.exp(-sigma * delta)
        trans = jnp.cumprod(jnp.concatenate([jnp.ones_like(alpha[:, :1]), 1 - alpha[:, :-1] + 1e-10], -1), -1)
        wts = alpha * trans
        color = (wts[..., None] * rgb).sum(1)
        return jnp.mean((color - target) ** 2)
    return "NeRF MLP (8 layers of 128, skip, 32 samples, 512 rays, volume rendering)", loss, ps, _nrm(98, (R, 9))

def mamba():
    D, N, T, B, layers = 64, 16, 128, 16, 2
    ps = [dict(win=_nrm(10*i, (D, 2*D), D**-.5), wdt=_nrm(10*i+1, (D, D), D**-.5), wb=_nrm(10*i+2, (D, N), D**-.5),
               wc=_nrm(10*i+3, (D, N), D**-.5), alog=jnp.log(jnp.tile(jnp.arange(1, N+1, dtype=jnp.float32), (D, 1))),
               wout=_nrm(10*i+4, (D, D), D**-.5)) for i in range(layers)]
    def ssm(p, x):  # x: (B, T, D)
        dt = jax.nn.softplus(x @ p["wdt"]); Bt = x @ p["wb"]; Ct = x @ p["wc"]; A = -jnp.exp(p["alog"])
        def step(hst, inp):
            xt, dtt, bt, ct = inp
            hst = jnp.exp(dtt[..., None] * A) * hst + (dtt * xt)[..., None] * bt[:, None, :]
            return hst, (hst * ct[:, None, :]).sum(-1)
        xs = tuple(jnp.swapaxes(a, 0, 1) for a in (x, dt, Bt, Ct))
        _, ys = lax.scan(step, jnp.zeros((x.shape[0], D, N)), xs)
        return jnp.swapaxes(ys, 0, 1)
    def loss(ps, x):
        for p in ps:
            u, g = jnp.split(x @ p["win"], 2, -1)
            x = x + (ssm(p, jax.nn.silu(u)) * jax.nn.silu(g)) @ p["wout"]
        return jnp.mean(x ** 2)
    return "selective SSM (Mamba-like, 2 layers, D 64, N 16, T 128, batch 16, lax.scan)", loss, ps, _nrm(97, (B, T, D))

def perceiver():
    M, C, Din, T, B, heads, blocks = 64, 128, 64, 512, 16, 4, 4
    def attn(q_in, kv_in, p):
        q = (q_in @ p["q"]).reshape(*q_in.shape[:-1], heads, -1); k = (kv_in @ p["k"]).reshape(*kv_in.shape[:-1], heads, -1)
        v = (kv_in @ p["v"]).reshape(*kv_in.shape[:-1], heads, -1)
        a = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]), -1)
        return jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(*q_in.shape[:-1], -1) @ p["o"]
    def ap(i, din):
        return dict(q=_nrm(i, (C, C), C**-.5), k=_nrm(i+1, (din, C), din**-.5), v=_nrm(i+2, (din, C), din**-.5), o=_nrm(i+3, (C, C), C**-.5),
                    m1=_nrm(i+4, (C, 4*C), C**-.5), m2=_nrm(i+5, (4*C, C), (4*C)**-.5))
    ps = dict(lat=_nrm(0, (M, C)), cross=ap(10, Din), blocks=[ap(20 + 10*i, C) for i in range(blocks)], head=_nrm(90, (C, 10), C**-.5))
    def ln(x):
        m = x.mean(-1, keepdims=True); return (x - m) * lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
    def loss(ps, data):
        x, y = data[..., :Din], data[:, 0, Din].astype(jnp.int32)
        z = jnp.broadcast_to(ps["lat"], (x.shape[0], M, C))
        def block(z, kv, p):
            z = z + attn(ln(z), kv, p)
            return z + jax.nn.gelu(ln(z) @ p["m1"]) @ p["m2"]
        z = block(z, x, ps["cross"])
        for p in ps["blocks"]:
            h = ln(z); z = block(z, h, p)
        logits = z.mean(1) @ ps["head"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))
    data = jnp.concatenate([_nrm(96, (B, T, Din)), jnp.broadcast_to((jnp.arange(B) % 10)[:, None, None].astype(jnp.float32), (B, T, 1))], -1)
    return "Perceiver (64 latents of 128, cross-attention to 512 inputs, 4 blocks, batch 16)", loss, ps, data

def capsules():
    B, Nin, Din, Nout, Dout = 32, 288, 8, 10, 16
    ps = dict(w=_nrm(0, (Nin, Nout, Dout, Din), 0.1), enc=_nrm(1, (64, Nin * Din), 0.1))
    def squash(s):
        n2 = (s ** 2).sum(-1, keepdims=True); return n2 / (1 + n2) * s / jnp.sqrt(n2 + 1e-8)
    def loss(ps, x):
        u = squash(jnp.tanh(x @ ps["enc"]).reshape(B, Nin, Din))
        uhat = jnp.einsum("ijdk,bik->bijd", ps["w"], u)
        def route(_, b):
            c = jax.nn.softmax(b, axis=2)
            v = squash(jnp.einsum("bij,bijd->bjd", c, uhat))
            return b + jnp.einsum("bijd,bjd->bij", uhat, v)
        b = lax.fori_loop(0, 3, route, jnp.zeros((B, Nin, Nout)))
        v = squash(jnp.einsum("bij,bijd->bjd", jax.nn.softmax(b, 2), uhat))
        return jnp.mean(jnp.sqrt((v ** 2).sum(-1) + 1e-8))
    return "capsule network (288 primary capsules, 3 routing iterations in fori_loop, batch 32)", loss, ps, _nrm(95, (B, 64))

def hypernet():
    B, z, h, d = 256, 32, 64, 32
    ps = dict(h1=_nrm(0, (z, 256), z**-.5), h2=_nrm(1, (256, d * h + h * d), 0.01), enc=_nrm(2, (d, z), d**-.5))
    def loss(ps, x):
        e = jnp.tanh(x @ ps["enc"])
        w = jnp.tanh(e @ ps["h1"]) @ ps["h2"]
        w1 = w[:, : d * h].reshape(B, d, h); w2 = w[:, d * h:].reshape(B, h, d)
        y = x
        for _ in range(4):
            y = y + jnp.einsum("bh,bhd->bd", jnp.tanh(jnp.einsum("bd,bdh->bh", y, w1)), w2)
        return jnp.mean((y - x[:, ::-1]) ** 2)
    return "hypernetwork (per-example weights of a 4-step residual MLP, batch 256)", loss, ps, _nrm(94, (B, d))


def gnn():
    N, E, d = 2048, 16384, 64
    snd = jax.random.randint(KEYS[3], (E,), 0, N)
    rcv = jax.random.randint(KEYS[4], (E,), 0, N)
    ps = [dict(m=_nrm(i, (2 * d, d), (2 * d) ** -.5), u=_nrm(50 + i, (2 * d, d), (2 * d) ** -.5)) for i in range(4)]
    def loss(ps, x):
        h = x
        for p in ps:
            msg = jax.nn.relu(jnp.concatenate([h[snd], h[rcv]], -1) @ p["m"])
            agg = jax.ops.segment_sum(msg, rcv, num_segments=N)
            h = h + jax.nn.relu(jnp.concatenate([h, agg], -1) @ p["u"])
        return jnp.mean(h ** 2)
    return "message-passing GNN (4 layers, 2048 nodes, 16384 edges, segment_sum)", loss, ps, _nrm(90, (N, d))

def moe():
    B, d, E, k = 1024, 64, 8, 2
    ps = [dict(r=_nrm(i, (d, E), d ** -.5), w1=_nrm(20 + i, (E, d, 4 * d), d ** -.5), w2=_nrm(40 + i, (E, 4 * d, d), (4 * d) ** -.5)) for i in range(3)]
    def loss(ps, x):
        for p in ps:
            logits = x @ p["r"]
            vals, idx = lax.top_k(logits, k)
            gates = jax.nn.softmax(vals, -1)
            mask = jax.nn.one_hot(idx, E) * gates[..., None]  # B,k,E
            comb = mask.sum(1)  # B,E
            hid = jax.nn.gelu(jnp.einsum("bd,edh->beh", x, p["w1"]))
            out = jnp.einsum("beh,ehd->bed", hid, p["w2"])
            x = x + jnp.einsum("be,bed->bd", comb, out)
        return jnp.mean(x ** 2)
    return "mixture of experts (3 layers, 8 experts, top-2 routing, batch 1024)", loss, ps, _nrm(91, (B, d))

@jax.custom_vjp
def ste(x, q):
    return q
def _ste_f(x, q): return q, None
def _ste_b(_, g): return g, jnp.zeros_like(g)
ste.defvjp(_ste_f, _ste_b)

def vqvae():
    B, d, K = 512, 64, 256
    ps = dict(e1=_nrm(0, (128, 256), 128 ** -.5), e2=_nrm(1, (256, d), 256 ** -.5), cb=_nrm(2, (K, d)), d1=_nrm(3, (d, 256), d ** -.5), d2=_nrm(4, (256, 128), 256 ** -.5))
    def loss(ps, x):
        z = jnp.tanh(x @ ps["e1"]) @ ps["e2"]
        dist = (z ** 2).sum(-1, keepdims=True) - 2 * z @ ps["cb"].T + (ps["cb"] ** 2).sum(-1)
        q = ps["cb"][jnp.argmin(dist, -1)]
        zq = ste(z, q)
        rec = jnp.tanh(zq @ ps["d1"]) @ ps["d2"]
        commit = jnp.mean((z - lax.stop_gradient(q)) ** 2) + jnp.mean((lax.stop_gradient(z) - q) ** 2)
        return jnp.mean((rec - x) ** 2) + 0.25 * commit
    return "VQ-VAE (straight-through custom_vjp, argmin codebook of 256, batch 512)", loss, ps, _nrm(92, (B, 128))

def negbin():
    B, d = 4096, 128
    ps = [_nrm(i, (d, d), d ** -.5) for i in range(6)] + [_nrm(10, (d, 2), d ** -.5)]
    y = jnp.floor(jnp.abs(_nrm(93, (B,))) * 5)
    def loss(ps, x):
        h = x
        for w in ps[:-1]:
            h = jax.nn.softplus(h @ w)
        o = h @ ps[-1]
        mu, r = jax.nn.softplus(o[:, 0]) + 1e-3, jax.nn.softplus(o[:, 1]) + 1e-3
        ll = (jax.scipy.special.gammaln(y + r) - jax.scipy.special.gammaln(r) - jax.scipy.special.gammaln(y + 1)
              + r * jnp.log(r / (r + mu)) + y * jnp.log(mu / (r + mu)))
        return -jnp.mean(ll)
    return "negative-binomial regression MLP (gammaln likelihood, 6 softplus layers, batch 4096)", loss, ps, _nrm(94, (B, d))

def linen_scan():
    import flax.linen as nn
    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            h = nn.LayerNorm()(x)
            h = nn.SelfAttention(num_heads=4, qkv_features=64, deterministic=True)(h)
            x = x + h
            h = nn.Dense(256)(nn.LayerNorm()(x)); x = x + nn.Dense(64)(nn.gelu(h))
            return x, None
    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            Stack = nn.scan(nn.remat(Block), variable_axes={"params": 0}, split_rngs={"params": True}, length=6)
            x, _ = Stack()(x, None)
            return x
    net = Net(); x = _nrm(95, (16, 64, 64))
    ps = net.init(jax.random.PRNGKey(0), x)
    loss = lambda ps, x: jnp.mean(net.apply(ps, x) ** 2)
    return "linen transformer (6 blocks in nn.scan of nn.remat, 64 tokens, batch 16)", loss, ps, x

def stochdepth():
    B, d = 2048, 128
    ps = [(_nrm(i, (d, d), d ** -.5), _nrm(30 + i, (d, d), d ** -.5)) for i in range(8)]
    def loss(ps, x):
        key = jax.random.PRNGKey(3)
        for i, (a, b) in enumerate(ps):
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 0.8)
            x = lax.cond(keep, lambda x: x + jnp.tanh(x @ a) @ b, lambda x: x, x)
        return jnp.mean(x ** 2)
    return "stochastic depth MLP (8 blocks, each in a lax.cond on a random draw, batch 2048)", loss, ps, _nrm(96, (B, d))


MODELS = {
    "depthwise": depthwise, "attention": attention, "map": mapped, "user_remat": user_remat,
    "recurrence8": recurrence(8), "recurrence32": recurrence(32),
    "fno": fno, "gp": gp, "bf16": bf16, "vit": vit, "pooling": pooling, "decoder": decoder, "fori": fori,
    "mixer": mixer, "wavenet": wavenet, "convnext": convnext, "triplet": triplet, "gru": gru, "vae": vae,
    "realnvp": realnvp, "nerf": nerf, "mamba": mamba, "perceiver": perceiver, "capsules": capsules, "hypernet": hypernet,
    "gnn": gnn, "moe": moe, "vqvae": vqvae, "negbin": negbin, "linen_scan": linen_scan, "stochdepth": stochdepth,
    **MORE,  # the tenth round
}


def relative_error(got, want) -> float:
    errors = [
        float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))) / (1e-6 + np.max(np.abs(np.asarray(w, np.float64)))))
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))
        if np.size(w)
    ]
    return max(errors, default=0.0)


def bench(name: str, repeats: int) -> list[str]:
    label, loss, params, x = MODELS[name]()
    jit = jax.jit(jax.grad(loss))
    expected = jit(params, x)
    full = compiled(jax.grad(loss), (params, x))[1]
    contenders, cells, errors = {"jit": jit}, {}, []
    for ratio in (1.0, 0.5):
        grad = jdtr.grad(loss, budget=ratio, chunks="always", return_stats=True)
        try:
            for _ in range(3):
                got, stats = grad(params, x)
        except jdtr.OutOfBudgetError as err:
            cells[ratio] = f"raises (its floor: {err.suggested_budget_bytes / 2**20:.2f} MiB suggested)"
            continue
        errors.append(relative_error(got, expected))
        cells[ratio] = f"{stats.chunks} chunks"
        contenders[ratio] = (lambda g: lambda *a: g(*a)[0])(grad)
    try:
        remat = jdtr.remat_grad(loss, budget=0.5)
        errors.append(relative_error(jax.jit(remat)(params, x), expected))
        cells["remat"] = f"{compiled(remat, (params, x))[1] / full:.3f}"
        contenders["remat"] = jax.jit(remat)
    except jdtr.OutOfBudgetError as err:
        cells["remat"] = f"raises, suggests {err.suggested_budget_bytes / full:.2f}"
    medians = interleaved_medians(contenders, (params, x), repeats)
    base = medians["jit"]
    ratio = {key: t / base for key, t in medians.items()}

    def cell(key) -> str:
        return f"{ratio[key]:.2f}x ({cells[key]})" if key in ratio else cells[key]

    remat_cell = cells["remat"] + (f", {ratio['remat']:.2f}x" if "remat" in ratio else "")
    return [
        f"| {label} | {base * 1e3:.1f} ms, {full / 2**20:.2f} MiB | {cell(1.0)} | {cell(0.5)} | {remat_cell} | {max(errors, default=0.0):.1e} |"
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--output", help="append the markdown report here")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # (the thrash and slow-plan warnings: the table says what they would)
    header = "| model | `jax.jit(jax.grad)` | `jdtr.grad` 1.0 | `jdtr.grad` 0.5 | remat 0.5 | max rel. error |"
    return report("Models beyond the repository", args.repeats, header, args.models, lambda name: bench(name, args.repeats), args.output)


if __name__ == "__main__":
    sys.exit(main())
