"""Reference models in Flax NNX (`jdtr.models`' own): each imports flax and
optax when called."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .jax_models import Model


def batchnorm_cnn(batch: int = 64, seed: int = 0) -> Model:
    """A small Flax NNX CNN with BatchNorm (issue 21's): where the paper's
    heuristics run out of budget at 0.6 of its peak and recompute 1.5x more
    than the optimum at 0.7. Its batch is (images, integer labels)."""
    import optax
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.c1 = nnx.Conv(1, 16, (3, 3), rngs=rngs)
            self.bn = nnx.BatchNorm(16, rngs=rngs)
            self.c2 = nnx.Conv(16, 16, (3, 3), rngs=rngs)
            self.out = nnx.Linear(16 * 8 * 8, 10, rngs=rngs)

        def __call__(self, x):
            h = nnx.relu(self.bn(self.c1(x)))
            h = nnx.relu(self.c2(h)) + h
            return self.out(h.reshape(h.shape[0], -1))

    graphdef, state = nnx.split(Net(nnx.Rngs(seed)))

    def loss(params, batch):
        x, y = batch
        return optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, params)(x), y).mean()

    x = jax.random.normal(jax.random.PRNGKey(seed), (batch, 8, 8, 1))
    return Model(f"batchnorm_cnn_b{batch}", loss, state, (x, jnp.arange(batch) % 10))


# ------------------------------------------------ Flax NNX models of issue 21's
# measures (a GPT, a ResNet with GroupNorm, a scan LSTM): the kinds of model the
# goals are checked on, written as users write them. Each imports flax and optax
# when called, as `batchnorm_cnn` does.


def _gpt_block(dim: int, heads: int):
    """A pre-norm GPT block in Flax NNX: causal self-attention and a GELU MLP."""
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln1, self.ln2 = nnx.LayerNorm(dim, rngs=rngs), nnx.LayerNorm(dim, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(heads, dim, decode=False, rngs=rngs)
            self.fc1, self.fc2 = nnx.Linear(dim, 4 * dim, rngs=rngs), nnx.Linear(4 * dim, dim, rngs=rngs)

        def __call__(self, x, mask):
            x = x + self.attn(self.ln1(x), mask=mask)
            return x + self.fc2(nnx.gelu(self.fc1(self.ln2(x))))

    return Block


def _next_token_model(module, batch: int, seq: int, vocab: int, seed: int):
    """The next-token loss of an NNX language model on its state, the state, and token ids."""
    import optax
    from flax import nnx

    graphdef, state = nnx.split(module)

    def loss(params, tokens):
        logits = nnx.merge(graphdef, params)(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    tokens = jax.random.randint(jax.random.PRNGKey(seed), (batch, seq + 1), 0, vocab)
    return loss, state, tokens


def flax_gpt(layers: int = 4, dim: int = 128, heads: int = 4, seq: int = 128, batch: int = 8, vocab: int = 256, seed: int = 0) -> Model:
    """A GPT in Flax NNX: pre-norm blocks of causal self-attention and a GELU
    MLP; the batch is token ids (batch, seq + 1), next-token loss."""
    from flax import nnx

    Block = _gpt_block(dim, heads)

    class GPT(nnx.Module):
        def __init__(self, rngs):
            self.embed, self.position = nnx.Embed(vocab, dim, rngs=rngs), nnx.Embed(seq, dim, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(layers)])
            self.ln, self.head = nnx.LayerNorm(dim, rngs=rngs), nnx.Linear(dim, vocab, rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens) + self.position(jnp.arange(tokens.shape[1]))
            mask = nnx.make_causal_mask(tokens)
            for block in self.blocks:
                x = block(x, mask)
            return self.head(self.ln(x))

    loss, state, tokens = _next_token_model(GPT(nnx.Rngs(seed)), batch, seq, vocab, seed)
    return Model(f"flax_gpt{layers}x{dim}_s{seq}_b{batch}", loss, state, tokens)


def flax_resnet_groupnorm(blocks: int = 8, channels: int = 32, image: int = 32, batch: int = 16, seed: int = 0) -> Model:
    """A ResNet in Flax NNX: residual blocks of two 3x3 convolutions with
    GroupNorm; the batch is (images, integer labels)."""
    import optax
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.c1, self.c2 = nnx.Conv(channels, channels, (3, 3), rngs=rngs), nnx.Conv(channels, channels, (3, 3), rngs=rngs)
            self.n1 = nnx.GroupNorm(channels, num_groups=8, rngs=rngs)
            self.n2 = nnx.GroupNorm(channels, num_groups=8, rngs=rngs)

        def __call__(self, x):
            h = nnx.relu(self.n1(self.c1(x)))
            return nnx.relu(x + self.n2(self.c2(h)))

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.stem = nnx.Conv(3, channels, (3, 3), rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(blocks)])
            self.out = nnx.Linear(channels, 10, rngs=rngs)

        def __call__(self, x):
            x = self.stem(x)
            for block in self.blocks:
                x = block(x)
            return self.out(x.mean(axis=(1, 2)))

    graphdef, state = nnx.split(Net(nnx.Rngs(seed)))

    def loss(params, batch):
        x, y = batch
        return optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, params)(x), y).mean()

    x = jax.random.normal(jax.random.PRNGKey(seed), (batch, image, image, 3))
    return Model(f"flax_resnet_gn{blocks}x{channels}_i{image}_b{batch}", loss, state, (x, jnp.arange(batch) % 10))


def _map_regression(net, name: str, image: int, batch: int, seed: int) -> Model:
    """`net`, regressing random one-channel maps of random RGB images by mean squared error."""
    from flax import nnx

    graphdef, state = nnx.split(net)

    def loss(params, batch):
        x, y = batch
        return jnp.mean((nnx.merge(graphdef, params)(x) - y) ** 2)

    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, (batch, image, image, 3))
    y = jax.random.normal(ky, (batch, image, image, 1))
    return Model(name, loss, state, (x, y))


def flax_unet(channels: int = 16, image: int = 32, batch: int = 16, seed: int = 0) -> Model:
    """A two-level U-Net in Flax NNX, regressing a one-channel map: 3x3
    convolutions with GELU and SiLU, an average pool down, nearest
    `jax.image.resize` up (a gather, whose pullback scatters into zeros), a
    LayerNorm, and skips concatenated across the bottleneck and from the
    first layer to the last."""
    from flax import nnx

    c = channels

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.down1 = nnx.Conv(3, c, (3, 3), rngs=rngs)
            self.down2 = nnx.Conv(c, 2 * c, (3, 3), rngs=rngs)
            self.mid = nnx.Conv(2 * c, 2 * c, (3, 3), rngs=rngs)
            self.up = nnx.Conv(4 * c, c, (3, 3), rngs=rngs)
            self.norm = nnx.LayerNorm(c, rngs=rngs)
            self.out = nnx.Conv(2 * c, 1, (1, 1), rngs=rngs)

        def __call__(self, x):
            h1 = nnx.gelu(self.down1(x))
            h2 = nnx.silu(self.down2(nnx.avg_pool(h1, (2, 2), strides=(2, 2))))
            u = jnp.concatenate([nnx.relu(self.mid(h2)) + h2, h2], -1)
            u = jax.image.resize(u, (u.shape[0], 2 * u.shape[1], 2 * u.shape[2], u.shape[3]), "nearest")
            u = self.norm(nnx.relu(self.up(u)))
            return self.out(jnp.concatenate([u, h1], -1))

    return _map_regression(Net(nnx.Rngs(seed)), f"flax_unet{channels}_i{image}_b{batch}", image, batch, seed)


def flax_unet3(channels: int = 16, image: int = 32, batch: int = 16, seed: int = 0) -> Model:
    """A three-level U-Net in Flax NNX, regressing a one-channel map: blocks
    of two 3x3 convolutions with a GroupNorm and ReLU, max pools down,
    stride-2 transposed convolutions up, and each level's skip concatenated."""
    from flax import nnx

    c = channels

    class Block(nnx.Module):
        def __init__(self, cin, cout, rngs):
            self.c1, self.c2 = nnx.Conv(cin, cout, (3, 3), rngs=rngs), nnx.Conv(cout, cout, (3, 3), rngs=rngs)
            self.norm = nnx.GroupNorm(cout, num_groups=4, rngs=rngs)

        def __call__(self, x):
            return nnx.relu(self.c2(nnx.relu(self.norm(self.c1(x)))))

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.d1, self.d2, self.d3 = Block(3, c, rngs), Block(c, 2 * c, rngs), Block(2 * c, 4 * c, rngs)
            self.up2 = nnx.ConvTranspose(4 * c, 2 * c, (2, 2), strides=(2, 2), rngs=rngs)
            self.u2 = Block(4 * c, 2 * c, rngs)
            self.up1 = nnx.ConvTranspose(2 * c, c, (2, 2), strides=(2, 2), rngs=rngs)
            self.u1, self.out = Block(2 * c, c, rngs), nnx.Conv(c, 1, (1, 1), rngs=rngs)

        def __call__(self, x):
            pool = lambda h: nnx.max_pool(h, (2, 2), (2, 2))  # noqa: E731
            a = self.d1(x)
            b = self.d2(pool(a))
            u = self.u2(jnp.concatenate([self.up2(self.d3(pool(b))), b], -1))
            return self.out(self.u1(jnp.concatenate([self.up1(u), a], -1)))

    return _map_regression(Net(nnx.Rngs(seed)), f"flax_unet3_{channels}_i{image}_b{batch}", image, batch, seed)


def flax_scan_lstm(steps: int = 64, hidden: int = 256, features: int = 64, batch: int = 64, seed: int = 0) -> Model:
    """An LSTM in Flax NNX (`OptimizedLSTMCell`) run by `lax.scan` over the
    steps of its batch (steps, batch, features), a linear read-out of every step."""
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.cell = nnx.OptimizedLSTMCell(features, hidden, rngs=rngs)
            self.out = nnx.Linear(hidden, 1, rngs=rngs)

    graphdef, state = nnx.split(Net(nnx.Rngs(seed)))

    def loss(params, xs):
        net = nnx.merge(graphdef, params)
        carry = (jnp.zeros((xs.shape[1], hidden)), jnp.zeros((xs.shape[1], hidden)))
        _, hs = jax.lax.scan(lambda c, x: net.cell(c, x), carry, xs)
        return jnp.mean(net.out(hs) ** 2)

    xs = jax.random.normal(jax.random.PRNGKey(seed), (steps, batch, features))
    return Model(f"flax_scan_lstm{steps}x{hidden}_b{batch}", loss, state, xs)


def flax_scan_gpt(layers: int = 12, dim: int = 128, heads: int = 4, seq: int = 128, batch: int = 8, vocab: int = 256, seed: int = 0) -> Model:
    """`flax_gpt` with its blocks' weights stacked and applied by `nnx.scan`
    (the blocks made by `nnx.vmap`): the JAX idiom for deep models."""
    from flax import nnx

    Block = _gpt_block(dim, heads)

    class GPT(nnx.Module):
        def __init__(self, rngs):
            self.embed, self.position = nnx.Embed(vocab, dim, rngs=rngs), nnx.Embed(seq, dim, rngs=rngs)

            @nnx.split_rngs(splits=layers)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def blocks(rngs):
                return Block(rngs)

            self.blocks = blocks(rngs)
            self.ln, self.head = nnx.LayerNorm(dim, rngs=rngs), nnx.Linear(dim, vocab, rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens) + self.position(jnp.arange(tokens.shape[1]))
            mask = nnx.make_causal_mask(tokens)

            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def run(x, block):
                return block(x, mask)

            return self.head(self.ln(run(x, self.blocks)))

    loss, state, tokens = _next_token_model(GPT(nnx.Rngs(seed)), batch, seq, vocab, seed)
    return Model(f"flax_scan_gpt{layers}x{dim}_s{seq}_b{batch}", loss, state, tokens)


def flax_tied_lm(layers: int = 4, dim: int = 128, seq: int = 64, batch: int = 16, vocab: int = 2000, seed: int = 0) -> Model:
    """A language model in Flax NNX whose output projection is its embedding
    (`nnx.Embed.attend`: tied weights), on residual ReLU layers, with a
    vocabulary large beside it: the step's memory is the logits' (batch x
    seq x vocab) and their cross-entropy's, not the layers'."""
    from flax import nnx

    class TiedLM(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(vocab, dim, rngs=rngs)
            self.layers = nnx.List([nnx.Linear(dim, dim, rngs=rngs) for _ in range(layers)])

        def __call__(self, tokens):
            h = self.embed(tokens)
            for layer in self.layers:
                h = h + nnx.relu(layer(h))
            return self.embed.attend(h)

    loss, state, tokens = _next_token_model(TiedLM(nnx.Rngs(seed)), batch, seq, vocab, seed)
    return Model(f"flax_tied_lm{layers}x{dim}_s{seq}_b{batch}_v{vocab}", loss, state, tokens)


def flax_gpt_megatron(
    mesh, blocks: int = 4, dim: int = 128, heads: int = 4, seq: int = 64, batch: int = 32, vocab: int = 256, seed: int = 0
) -> Model:
    """A GPT in Flax NNX placed on `mesh` (axes "data" and "model"),
    Megatron's way: the attention's fused QKV kernel and the MLP's first
    kernel split over "model" by columns, the attention's output and the
    MLP's second kernel by rows, the embedding by features, the rest
    replicated; token ids split over "data". The loss is written with
    `log_softmax` (no custom derivative). On the 2x4 mesh with `Auto` axes
    the whole step shards some gradients otherwise than their equations
    alone do (the LayerNorm biases, the QKV kernels)."""
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln1, self.ln2 = nnx.LayerNorm(dim, rngs=rngs), nnx.LayerNorm(dim, rngs=rngs)
            self.qkv, self.o = nnx.Linear(dim, 3 * dim, rngs=rngs), nnx.Linear(dim, dim, rngs=rngs)
            self.up, self.down = nnx.Linear(dim, 4 * dim, rngs=rngs), nnx.Linear(4 * dim, dim, rngs=rngs)

        def __call__(self, x):
            b, t, _ = x.shape
            q, k, v = (z.reshape(b, t, heads, dim // heads) for z in jnp.split(self.qkv(self.ln1(x)), 3, -1))
            x = x + self.o(jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, dim))
            return x + self.down(nnx.gelu(self.up(self.ln2(x))))

    class GPT(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(vocab, dim, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(blocks)])
            self.head = nnx.Linear(dim, vocab, rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    def placement(path, _):
        names = {str(getattr(p, "key", p)) for p in path}
        if "kernel" in names:
            return P(None, "model") if {"qkv", "up"} & names else P("model", None) if {"o", "down"} & names else P()
        return P(None, "model") if "embedding" in names else P()

    graphdef, state = nnx.split(GPT(nnx.Rngs(seed)))
    state = jax.tree_util.tree_map_with_path(lambda path, a: jax.device_put(a, NamedSharding(mesh, placement(path, a))), state)
    tokens = jax.random.randint(jax.random.PRNGKey(seed + 1), (batch, seq + 1), 0, vocab)

    def loss(state, tokens):
        logits = nnx.merge(graphdef, state)(tokens[:, :-1])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))

    tokens = jax.device_put(tokens, NamedSharding(mesh, P("data")))
    return Model(f"flax_gpt_megatron{blocks}x{dim}_s{seq}_b{batch}", loss, state, tokens)
