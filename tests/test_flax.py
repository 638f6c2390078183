"""jdtr with Flax: `jdtr.nnx` against flax.nnx's own functions, and Linen through params."""

from __future__ import annotations

import contextlib
import io
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import ad_checkpoint

pytest.importorskip("flax")
from flax import linen, nnx  # noqa: E402

import jdtr  # noqa: E402
import jdtr.models  # noqa: E402
import jdtr.nnx  # noqa: E402
from budgets import biting_plan  # noqa: E402
from test_plan import compiled_total  # noqa: E402


class Net(nnx.Module):
    def __init__(self, rngs, depth=4, width=32):
        self.embed = nnx.Linear(8, width, use_bias=False, rngs=rngs)  # a bias before BatchNorm has zero gradient: Adam would amplify its noise
        self.bn = nnx.BatchNorm(width, rngs=rngs)
        self.drop = nnx.Dropout(0.2, rngs=rngs)
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])
        self.head = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, x):
        h = self.drop(nnx.relu(self.bn(self.embed(x))))
        for layer in self.layers:
            h = nnx.tanh(layer(h))
        return self.head(h)


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def data(seed=0, n=1024):
    x = jax.random.normal(jax.random.PRNGKey(seed), (n, 8))
    return x, jnp.sin(x[:, :1])


def leaves_close(a, b, rtol=1e-5, atol=1e-6):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for u, v in zip(la, lb):
        if jax.dtypes.issubdtype(u.dtype, jax.dtypes.extended):  # PRNG keys: compare their words
            u, v = jax.random.key_data(u), jax.random.key_data(v)
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=rtol, atol=atol)


def test_nnx_value_and_grad_matches_flax_including_state_and_optimizer():
    x, y = data()
    ours, theirs = Net(nnx.Rngs(0)), Net(nnx.Rngs(0))
    opt_ours = nnx.Optimizer(ours, optax.adam(1e-2), wrt=nnx.Param)
    opt_theirs = nnx.Optimizer(theirs, optax.adam(1e-2), wrt=nnx.Param)
    grad_ours = jdtr.nnx.value_and_grad(loss_fn, budget=0.5, return_stats=True)
    for _ in range(3):
        (loss_a, grads_a), stats = grad_ours(ours, x, y)
        loss_b, grads_b = nnx.value_and_grad(loss_fn)(theirs, x, y)
        assert isinstance(grads_a, nnx.State)
        assert jax.tree_util.tree_structure(grads_a) == jax.tree_util.tree_structure(grads_b)
        np.testing.assert_allclose(loss_a, loss_b, rtol=1e-6)
        leaves_close(grads_a, grads_b)
        assert stats.rematerializations > 0 and stats.peak_bytes <= stats.budget_bytes
        opt_ours.update(ours, grads_a)
        opt_theirs.update(theirs, grads_b)
    # parameters, BatchNorm statistics and RNG counters all moved the same way
    leaves_close(nnx.state(ours), nnx.state(theirs))
    # (from the second call on, compiled chunks: XLA fuses them its own way, float32 rounding)
    np.testing.assert_allclose(ours.bn.mean[...], theirs.bn.mean[...], rtol=1e-5, atol=1e-9)
    assert int(ours.drop.rngs.count[...]) == int(theirs.drop.rngs.count[...]) == 3


def test_nnx_grad_with_aux_and_second_argument():
    x, y = data(1)
    ours, theirs = Net(nnx.Rngs(1)), Net(nnx.Rngs(1))

    def loss_aux(model, x, y):
        pred = model(x)
        return jnp.mean((pred - y) ** 2), {"mean": jnp.mean(pred)}

    (grads_a, xgrad_a), aux_a = jdtr.nnx.grad(loss_aux, budget=0.6, argnums=(0, 1), has_aux=True)(ours, x, y)
    (grads_b, xgrad_b), aux_b = nnx.grad(loss_aux, argnums=(0, 1), has_aux=True)(theirs, x, y)
    leaves_close((grads_a, xgrad_a, aux_a), (grads_b, xgrad_b, aux_b))


_PLAIN_IMPORT = """
import sys
import jdtr
assert "flax" not in sys.modules, "import jdtr imported Flax"
assert "nnx" in dir(jdtr)
sys.modules["flax"] = None  # as if Flax were not installed
try:
    jdtr.nnx
except ModuleNotFoundError as error:
    assert error.name == "flax" and "pip install 'jdtr[flax]'" in str(error), error
else:
    raise AssertionError("jdtr.nnx without Flax did not raise")
del sys.modules["flax"]
from flax import nnx
import optax, jax.numpy as jnp
model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
x = jnp.ones((4, 3))
loss = lambda m, x: jnp.sum(m(x) ** 2)
ours, theirs = jdtr.nnx.value_and_grad(loss)(model, x), nnx.value_and_grad(loss)(model, x)
assert float(ours[0]) == float(theirs[0]) and jdtr.nnx is sys.modules["jdtr.nnx"]
print("ok")
"""


def test_jdtr_nnx_after_a_plain_import_jdtr_as_the_readme_writes_it():
    """`import jdtr` then `jdtr.nnx.value_and_grad(...)`, as the README's
    Flax section, raised AttributeError: the submodule had to be imported by
    name. It is imported on first use (Flax, optional, only then), and
    without Flax the error says what to install. In a fresh process: here
    the tests imported `jdtr.nnx` long before."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PLAIN_IMPORT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_nnx_grad_without_a_budget_is_unconstrained_as_jdtr_grad():
    """The budget is optional in `jdtr.nnx` as in `jdtr.grad` (issue 23: the
    defaults agree across the API): None runs without evicting anything."""
    x, y = data(3)
    ours, theirs = Net(nnx.Rngs(3)), Net(nnx.Rngs(3))
    (loss_a, grads_a), stats = jdtr.nnx.value_and_grad(loss_fn, return_stats=True)(ours, x, y)
    loss_b, grads_b = nnx.value_and_grad(loss_fn)(theirs, x, y)
    np.testing.assert_allclose(loss_a, loss_b, rtol=1e-6)
    leaves_close(grads_a, grads_b)
    assert stats.budget_bytes is None or stats.budget_bytes >= stats.unconstrained_peak_bytes
    assert stats.evictions == 0 and stats.rematerializations == 0
    leaves_close(nnx.state(ours), nnx.state(theirs))


class DropoutNet(nnx.Module):
    """Dropout drawing from an `nnx.Rngs` passed at call time."""

    def __init__(self, rngs):
        self.l1, self.drop, self.l2 = nnx.Linear(8, 32, rngs=rngs), nnx.Dropout(0.5), nnx.Linear(32, 1, rngs=rngs)

    def __call__(self, x, rngs):
        return self.l2(self.drop(nnx.relu(self.l1(x)), rngs=rngs))


def test_nnx_grad_with_an_rngs_argument_matches_flax_and_advances_its_counts():
    """Issue 23, item 1: an `nnx.Rngs` argument (a graph node, not a Module)
    is split and merged as `nnx.grad` does: same gradients, its counts
    written back (it raised TraceContextError: its count was mutated from
    inside the gradient's trace)."""

    def loss(model, x, rngs):
        return jnp.mean(model(x, rngs) ** 2)

    x, _ = data(4, n=64)
    ours, theirs = DropoutNet(nnx.Rngs(0)), DropoutNet(nnx.Rngs(0))
    rngs_ours, rngs_theirs = nnx.Rngs(dropout=5), nnx.Rngs(dropout=5)
    grad_ours = jdtr.nnx.grad(loss, budget=0.8, return_stats=True)
    for call in range(3):  # the second and third calls reuse the trace and the plan
        grads_a, stats = grad_ours(ours, x, rngs_ours)
        grads_b = nnx.grad(loss)(theirs, x, rngs_theirs)
        leaves_close(grads_a, grads_b)
        assert int(rngs_ours.dropout.count[...]) == int(rngs_theirs.dropout.count[...]) == call + 1
        assert stats.cache_hit == (call > 0) and stats.peak_bytes <= stats.budget_bytes
    assert float(jnp.sum(jnp.abs(grads_a["l1"]["kernel"][...]))) > 0  # dropout kept a gradient to compare


def test_nnx_calls_reuse_the_trace_and_plan_of_their_structure():
    """A `jdtr.nnx` wrapper keeps one `jdtr.value_and_grad` per structure
    (argument count, graph definitions): its second call on the same model
    reuses the trace and the plan, and runs as compiled chunks (it traced
    and planned every call); another structure gets its own."""
    x, y = data(5, n=256)
    model = Net(nnx.Rngs(5))
    f = jdtr.nnx.grad(loss_fn, budget=0.6, return_stats=True)
    stats = [f(model, x, y)[1] for _ in range(3)]
    assert [s.cache_hit for s in stats] == [False, True, True]
    assert stats[2].trace_time_s == 0.0 and stats[2].execution == "chunks"
    other = Net(nnx.Rngs(6), depth=3)  # another graph definition
    assert not f(other, x, y)[1].cache_hit
    assert f(model, x, y)[1].cache_hit  # the first structure is still kept


def test_nnx_keyword_arguments_are_inputs_of_the_kept_trace():
    """Keyword arguments enter the trace as `jdtr.grad`'s do: arrays as
    inputs (a new value reuses the trace, and is the one used), other
    values static (a new one is another structure)."""

    def scaled(model, x, y, *, scale, power):
        return jnp.mean(jnp.abs(model(x) - y) ** power) * scale

    x, y = data(7, n=256)
    model, reference = Net(nnx.Rngs(7)), Net(nnx.Rngs(7))
    reference.eval(), model.eval()  # no dropout draws: the two runs see the same model
    f = jdtr.nnx.grad(scaled, budget=0.6, return_stats=True)
    for scale, power, hit in ((jnp.float32(2.0), 2, False), (jnp.float32(3.0), 2, True), (jnp.float32(3.0), 3, False)):
        grads, stats = f(model, x, y, scale=scale, power=power)
        assert stats.cache_hit == hit
        expected = nnx.grad(lambda m, x, y: scaled(m, x, y, scale=scale, power=power))(reference, x, y)  # (nnx.grad takes no keywords)
        leaves_close(grads, expected, rtol=1e-4, atol=1e-6)


def test_nnx_eval_mode_changes_nothing():
    x, y = data(2)
    model = Net(nnx.Rngs(2))
    model.eval()
    before = jax.tree_util.tree_map(jnp.copy, nnx.state(model, nnx.BatchStat))
    jdtr.nnx.grad(loss_fn, budget=0.7)(model, x, y)
    leaves_close(nnx.state(model, nnx.BatchStat), before)


class LinenNet(linen.Module):
    @linen.compact
    def __call__(self, x, train: bool = True):
        x = linen.Dense(32)(x)
        x = linen.BatchNorm(use_running_average=not train)(x)
        for _ in range(4):
            x = jnp.tanh(linen.Dense(32)(x))
        return linen.Dense(1)(x)


def test_linen_through_params_pytree():
    x, y = data(3)
    model = LinenNet()
    variables = model.init(jax.random.PRNGKey(0), x)

    def loss(params, batch_stats, x, y):
        pred, updates = model.apply({"params": params, "batch_stats": batch_stats}, x, mutable=["batch_stats"])
        return jnp.mean((pred - y) ** 2), updates["batch_stats"]

    args = (variables["params"], variables["batch_stats"], x, y)
    (value_a, stats_a), grads_a = jdtr.value_and_grad(loss, has_aux=True, budget=0.5)(*args)
    (value_b, stats_b), grads_b = jax.value_and_grad(loss, has_aux=True)(*args)
    np.testing.assert_allclose(value_a, value_b, rtol=1e-6)
    leaves_close((grads_a, stats_a), (grads_b, stats_b))
    opt = optax.sgd(0.1)
    state = opt.init(variables["params"])
    updates, _ = opt.update(grads_a, state)
    new_params = optax.apply_updates(variables["params"], updates)
    assert jax.tree_util.tree_structure(new_params) == jax.tree_util.tree_structure(variables["params"])


def saved_residuals(f, *args) -> list[str]:
    """What JAX saves for f's backward pass, beyond its arguments (print_saved_residuals' lines)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ad_checkpoint.print_saved_residuals(f, *args)
    return [line for line in out.getvalue().splitlines() if "from the argument" not in line]


class Chain(nnx.Module):
    """Tanh layers, run in groups of `every`; `segment` wraps each group (e.g. in `nnx.remat`)."""

    def __init__(self, rngs, depth, width=32):
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])

    def run(self, h, start, stop):
        for layer in self.layers[start:stop]:
            h = nnx.tanh(layer(h))
        return h

    def __call__(self, x, segment=lambda f: f, every=3):
        for start in range(0, len(self.layers), every):
            x = segment(Chain.group(start, start + every))(self, x)
        return jnp.mean(x**2)

    @staticmethod
    def group(start, stop):
        return lambda model, h: model.run(h, start, stop)


class LinenGroup(linen.Module):
    @linen.compact
    def __call__(self, x):
        for _ in range(3):
            x = jnp.tanh(linen.Dense(32)(x))
        return x


class LinenChain(linen.Module):
    policy: object = None

    @linen.compact
    def __call__(self, x):
        group = LinenGroup if self.policy is None else linen.remat(LinenGroup, policy=self.policy)
        for i in range(4):
            x = group(name=f"group{i}")(x)  # the same parameter names with and without remat
        return jnp.mean(x**2)


def _policy_of(plan):
    """`plan.policy`, and a check of its warning, if any: it names signatures of the policy."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = plan.policy
    for w in caught:
        assert isinstance(w.message, jdtr.PolicyWarning) and set(w.message.mixed) <= policy.signatures, w.message
    return policy


def _kept(lines: list[str], policy) -> int:
    """Residuals that are outputs of the primitives of `policy`'s signatures."""
    names = {name for name, _ in policy.signatures}
    return sum(any(f"output of {name} " in line for name in names) for line in lines)


def test_plan_policy_works_with_nnx_remat_and_linen_remat():
    """A plan's policy carries over, by primitive signature, to Flax modules
    wrapped in `nnx.remat` / `linen.remat` (groups of three layers): the
    gradients are unchanged, and inside each group it keeps values of the
    signatures the plan saves, at least one a layer (JAX 0.10's program at
    0.6: tanh outputs; 0.11's: the bias adds before them; 0.11's at the
    budget it fits, both, where a saved tanh output leaves its bias add
    read by nothing), where nothing_saveable keeps fewer (the groups'
    outputs). (At 0.5 the chain nested to the left fits, saving nothing
    inside: no policy to carry.) (Signatures cannot tell one layer's
    values from another's: the policy keeps them all, as the compiled
    plan's names would not, and says so where the plan keeps only some.)"""
    x = jax.random.normal(jax.random.PRNGKey(0), (2048, 32))  # activations, not weights, dominate
    depth = 12
    model = Chain(nnx.Rngs(0), depth=depth)
    graphdef, state = nnx.split(model)

    def loss(state, x, segment=lambda f: f):
        return nnx.merge(graphdef, state)(x, segment)

    plan = biting_plan(loss, state, x, fraction=0.6, autotune=False)
    policy = _policy_of(plan)
    assert policy.signatures and all(args[0] == ((2048, 32), "float32") for _, args in policy.signatures), plan.report()
    reference = jax.grad(loss)(state, x)

    def kept(policy_used):
        return _kept(saved_residuals(lambda s: loss(s, x, lambda f: nnx.remat(f, policy=policy_used)), state), policy)

    got = jax.jit(jax.grad(lambda s: loss(s, x, lambda f: nnx.remat(f, policy=policy))))(state)
    leaves_close(got, reference)
    assert kept(jax.checkpoint_policies.nothing_saveable) < depth <= kept(policy) <= depth * len(policy.signatures)

    chain = LinenChain()
    params = chain.init(jax.random.PRNGKey(1), x)
    linen_plan = biting_plan(lambda p, x: chain.apply(p, x), params, x, fraction=0.6, autotune=False)
    linen_policy = _policy_of(linen_plan)
    remat_chain = LinenChain(policy=linen_policy)
    got = jax.jit(jax.grad(lambda p: remat_chain.apply(p, x)))(params)
    reference = jax.grad(lambda p: chain.apply(p, x))(params)
    leaves_close(got, reference)

    def linen_kept(policy_used):
        module = LinenChain(policy=policy_used)
        return _kept(saved_residuals(lambda p: module.apply(p, x), params), linen_policy)

    assert linen_policy.signatures, linen_plan.report()
    assert linen_kept(jax.checkpoint_policies.nothing_saveable) < depth <= linen_kept(linen_policy) <= depth * len(linen_policy.signatures)


class ScannedBlocks(nnx.Module):
    """Blocks made by `nnx.vmap` and run by `nnx.scan`, each optionally under `nnx.remat(policy=...)`."""

    def __init__(self, rngs, layers=6, width=64):
        @nnx.split_rngs(splits=layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def blocks(rngs):
            return nnx.Sequential(nnx.Linear(width, 2 * width, rngs=rngs), nnx.tanh, nnx.Linear(2 * width, width, rngs=rngs))

        self.blocks = blocks(rngs)
        self.head = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, x, policy=None):
        def layer(h, block):
            return h + jnp.tanh(block(h))

        if policy is not None:
            layer = nnx.remat(layer, policy=policy)

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def run(h, block):
            return layer(h, block)

        return self.head(run(x, self.blocks))


def test_plan_policy_on_a_block_under_nnx_scan_compiles_to_the_plans_bytes():
    """The per-layer use the README documents: `nnx.remat(layer,
    policy=plan.policy)` on the block `nnx.scan` runs saves what the plan
    saves per iteration (here its matmul outputs), so it compiles to
    `plan.grad`'s bytes, with `nnx.grad`'s gradients."""
    x = jax.random.normal(jax.random.PRNGKey(0), (512, 64))
    graphdef, state = nnx.split(ScannedBlocks(nnx.Rngs(0)))

    def loss_with(policy):
        return lambda state, x: jnp.mean(nnx.merge(graphdef, state)(x, policy) ** 2)

    loss = loss_with(None)
    full = compiled_total(jax.grad(loss), state, x)
    plan = jdtr.plan(loss, state, x, budget=0.8, autotune=False)
    assert [k.strategy.saves for k in plan.scans] == ["dots"], plan.report()
    user = jax.grad(loss_with(plan.policy))
    assert compiled_total(user, state, x) == pytest.approx(plan.compiled_bytes, rel=0.02)
    assert plan.compiled_bytes <= 0.8 * full
    leaves_close(jax.jit(user)(state, x), jax.grad(loss)(state, x), rtol=1e-4, atol=1e-6)


FLAX_MODELS = {
    "gpt": lambda: jdtr.models.flax_gpt(layers=2, dim=32, heads=2, seq=16, batch=4, vocab=32),
    "resnet_groupnorm": lambda: jdtr.models.flax_resnet_groupnorm(blocks=2, channels=8, image=8, batch=4),
    "scan_lstm": lambda: jdtr.models.flax_scan_lstm(steps=6, hidden=16, features=8, batch=32),
}


@pytest.mark.parametrize("name", sorted(FLAX_MODELS))
def test_the_flax_reference_models_planned_and_chunked(name):
    """The benchmarks' Flax models (issue 21's kinds): gradients equal
    `jax.grad`'s at half the peak, the second call as compiled chunks within
    the budget."""
    model = FLAX_MODELS[name]()
    f = jdtr.grad(model.loss, budget=0.5, return_stats=True)
    expected = jax.grad(model.loss)(model.params, model.batch)
    for call in range(2):
        grads, stats = f(model.params, model.batch)
        # Something is recomputed: by DTR, or by the scan strategy of a kept scan.
        assert stats.peak_bytes <= stats.budget_bytes and stats.overhead > 1.0
        for a, e in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(expected)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=2e-4, atol=1e-5)
    assert stats.execution == "chunks" and stats.chunks < stats.equations


class DeepMLP(nnx.Module):
    """A residual-free tanh stack with BatchNorm and dropout: state the step
    mutates (batch statistics, RNG counts) beside parameters it differentiates."""

    def __init__(self, rngs, depth=16, width=64):
        self.bn = nnx.BatchNorm(width, rngs=rngs)
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])
        self.drop = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x):
        x = self.bn(x)
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return self.drop(x)


def deep_loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def test_nnx_remat_value_and_grad_under_nnx_jit_trains_like_flax_within_the_budget():
    """`jdtr.nnx.remat_value_and_grad` inside `nnx.jit`: the same losses,
    parameters, batch statistics and RNG counts as `nnx.value_and_grad` over
    three optimizer steps, and the compiled gradient step within the budget
    (a fraction of `jax.grad`'s compiled bytes, as `jdtr.remat_grad`'s)."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2048, 64))
    y = jnp.zeros((2048, 64))
    model, reference = DeepMLP(nnx.Rngs(0)), DeepMLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    ref_optimizer = nnx.Optimizer(reference, optax.sgd(0.1), wrt=nnx.Param)
    budget = 0.6

    @nnx.jit
    def step(model, optimizer, x, y):
        loss, grads = jdtr.nnx.remat_value_and_grad(deep_loss, budget=budget)(model, x, y)
        optimizer.update(model, grads)
        return loss

    @nnx.jit
    def ref_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(deep_loss)(model, x, y)
        optimizer.update(model, grads)
        return loss

    for _ in range(3):
        np.testing.assert_allclose(step(model, optimizer, x, y), ref_step(reference, ref_optimizer, x, y), rtol=1e-5)
    leaves_close(nnx.state(model), nnx.state(reference), rtol=1e-4, atol=1e-6)  # params, statistics, counts

    # The gradient step alone, compiled: within the budget of jax.grad's bytes.
    graphdef, state = nnx.split(reference)

    def bytes_of(fn):
        analysis = jax.jit(fn).lower(state, x, y).compile().memory_analysis()
        return analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes - analysis.alias_size_in_bytes

    def planned(state, x, y):
        return jdtr.nnx.remat_grad(deep_loss, budget=budget)(nnx.merge(graphdef, state), x, y)

    def plain(state, x, y):
        return nnx.grad(deep_loss)(nnx.merge(graphdef, state), x, y)

    assert bytes_of(planned) <= budget * bytes_of(plain) * 1.1


class NormBlock(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(4, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)

    def __call__(self, x):
        return jnp.tanh(self.bn(self.lin(x)))


@pytest.mark.parametrize("engine", ["grad", "remat_grad"])
def test_containers_of_modules_as_one_argument_as_nnx_grad(engine):
    """A dict holding a module and a list of modules, as one argument (issue
    23 item 1): the gradients come back in `nnx.grad`'s structure (a State
    per module, in the container), equal to it, and every module's batch
    statistics are written back."""

    def make():
        return {"a": NormBlock(nnx.Rngs(0)), "b": [NormBlock(nnx.Rngs(1)), NormBlock(nnx.Rngs(2))]}

    def loss(models, x, scale):
        x = models["a"](x)
        for block in models["b"]:
            x = block(x)
        return jnp.sum(x**2) * scale

    x = jax.random.normal(jax.random.PRNGKey(0), (8, 4))
    ours, theirs = make(), make()
    options = {"budget": 0.9} if engine == "grad" else {"budget": 1.0}
    got = getattr(jdtr.nnx, engine)(loss, argnums=(0, 2), **options)(ours, x, 2.0)
    expected = nnx.grad(loss, argnums=(0, 2))(theirs, x, 2.0)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected)
    leaves_close(got, expected)
    for mine, reference in [(ours["a"], theirs["a"]), *zip(ours["b"], theirs["b"])]:
        statistics = nnx.state(reference, nnx.BatchStat)
        assert float(jnp.abs(statistics["bn"]["mean"][...]).sum()) > 0  # the step moved them
        leaves_close(nnx.state(mine, nnx.BatchStat), statistics)


class LoraNet(nnx.Module):
    def __init__(self, rngs):
        factor = nnx.initializers.normal(0.3)  # (LoRA's B starts at zero: A's gradient would be zero too)
        self.layers = nnx.List([nnx.LoRALinear(16, 16, lora_rank=4, b_initializer=factor, rngs=rngs) for _ in range(4)])
        self.bn = nnx.BatchNorm(16, rngs=rngs)

    def __call__(self, x):
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return self.bn(x)


@pytest.mark.parametrize("engine", ["value_and_grad", "remat_value_and_grad"])
def test_argnums_with_diff_states_as_flax_nnx_takes_them(engine):
    """`argnums` as `flax.nnx` takes it: an `nnx.DiffState(argnum, filter)`
    differentiates that argument's state of its own filter (here LoRA's
    factors alone, the base weights frozen), alone or among ints; gradients
    and values come back as `nnx.value_and_grad` gives them, batch
    statistics written back. Before, any DiffState was refused ("argnums
    must be an int or a tuple of ints")."""
    x = jax.random.normal(jax.random.PRNGKey(0), (32, 16))

    def loss(model, x, scale):
        return jnp.mean(model(x) ** 2) * scale

    lora = nnx.DiffState(0, nnx.LoRAParam)
    options = {"budget": 0.9} if engine == "value_and_grad" else {"budget": 1.0}
    for argnums in (lora, (lora, 2), (1, lora)):
        ours, theirs = LoraNet(nnx.Rngs(0)), LoraNet(nnx.Rngs(0))
        (value, grads) = getattr(jdtr.nnx, engine)(loss, argnums=argnums, **options)(ours, x, 2.0)
        (expected_value, expected) = nnx.value_and_grad(loss, argnums=argnums)(theirs, x, 2.0)
        np.testing.assert_allclose(value, expected_value, rtol=1e-6)
        assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(expected), argnums
        leaves_close(grads, expected)
        module_grads = expected if argnums is lora else expected[argnums.index(lora)]
        # The filter is what was differentiated: LoRA's factors, fewer than all the parameters.
        assert 0 < len(jax.tree_util.tree_leaves(module_grads)) < len(jax.tree_util.tree_leaves(nnx.state(theirs, nnx.Param)))
        leaves_close(nnx.state(ours, nnx.BatchStat), nnx.state(theirs, nnx.BatchStat))
    with pytest.raises(ValueError, match="argnum 0 is repeated"):
        jdtr.nnx.value_and_grad(loss, argnums=(0, lora), **options)(LoraNet(nnx.Rngs(0)), x, 2.0)
    with pytest.raises(TypeError, match="an int, an nnx.DiffState or a sequence of them"):
        jdtr.nnx.value_and_grad(loss, argnums=(lora, "x"), **options)


def test_used_as_decorators_as_flax_nnx_transforms_are():
    """`@jdtr.nnx.grad(budget=..., argnums=...)` without the function, as
    `@nnx.grad(argnums=...)` is written: a decorator that takes it, with
    the options given. Before, the function was a required argument."""
    x = jax.random.normal(jax.random.PRNGKey(0), (32, 16))

    def loss(model, x):
        return jnp.mean(model(x) ** 2)

    ours, theirs = LoraNet(nnx.Rngs(0)), LoraNet(nnx.Rngs(0))
    lora = nnx.DiffState(0, nnx.LoRAParam)
    leaves_close(jdtr.nnx.grad(budget=0.9, argnums=lora)(loss)(ours, x), nnx.grad(argnums=lora)(loss)(theirs, x))

    @jdtr.nnx.remat_value_and_grad(budget=1.0, has_aux=True)
    def step(model, x):
        return loss(model, x), x.sum()

    (value, aux), grads = step(ours, x)
    (expected_value, expected_aux), expected = nnx.value_and_grad(lambda m, x: (loss(m, x), x.sum()), has_aux=True)(theirs, x)
    np.testing.assert_allclose(value, expected_value, rtol=1e-6)
    np.testing.assert_allclose(aux, expected_aux, rtol=1e-6)
    leaves_close(grads, expected)


def test_a_module_given_by_keyword_is_differentiated_as_flax_nnx_does():
    """Arguments given by keyword take the position they name, as
    `flax.nnx.grad` resolves them: `argnums=0` means the module also when it
    is passed as `model=`, whose gradients come back and whose batch
    statistics are written back. Before, `argnums=0` was "out of range for
    0 positional arguments"."""
    x = jax.random.normal(jax.random.PRNGKey(0), (32, 16))

    def loss(model, x, scale=1.0):
        return jnp.mean(model(x) ** 2) * scale

    ours, theirs = LoraNet(nnx.Rngs(0)), LoraNet(nnx.Rngs(0))
    got = jdtr.nnx.grad(loss, budget=0.9)(model=ours, x=x)
    expected = nnx.grad(loss)(model=theirs, x=x)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected)
    leaves_close(got, expected)
    leaves_close(nnx.state(ours, nnx.BatchStat), nnx.state(theirs, nnx.BatchStat))
    # `scale=` takes position 2, outside argnums: not differentiated, the same gradients scaled.
    scaled = jdtr.nnx.grad(loss, budget=0.9)(ours, x, scale=2.0)
    leaves_close(scaled, jax.tree_util.tree_map(lambda g: 2 * g, nnx.grad(loss)(theirs, x)))
