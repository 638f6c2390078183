"""Examples run in a short mode and report what they promise."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import re
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
REPORT = re.compile(r"^peak (\S+ \S+) <= budget (\S+ \S+) \(unconstrained (\S+ \S+)\), overhead (\d+\.\d+)x", re.MULTILINE)
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def load(name):
    if str(EXAMPLES) not in sys.path:  # the examples import their shared helpers (examples/_common.py)
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(name, argv, capsys):
    """Runs an example's main; returns its result, its stdout, and its final report line's numbers."""
    result = load(name).main(argv)
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    match = REPORT.match(last)
    assert match, f"the last line is not the report: {last!r}"
    peak, budget, unconstrained = (float(s.split()[0]) * UNITS[s.split()[1]] for s in match.groups()[:3])
    assert peak <= budget < unconstrained
    assert float(match.group(4)) >= 1.0
    return result, out, last


def number(pattern, text):
    match = re.search(pattern, text)
    assert match, pattern
    return float(match.group(1))


def test_train_mlp_short(capsys):
    loss, out, last = run("train_mlp", ["--steps", "3", "--layers", "8", "--width", "32", "--batch", "256", "--budget", "0.5"], capsys)
    assert loss == pytest.approx(loss) and loss < 1.0
    assert "max |jdtr - jax.grad| = 0.00e+00" in last


def test_cnn_digits_matches_plain_nnx(capsys):
    argv = ["--steps", "2", "--blocks", "1", "--channels", "8", "--batch", "32", "--budget", "0.5", "--compare"]
    accuracy, out, last = run("train_cnn_digits", argv, capsys)
    ours = number(r"jdtr\.nnx\.value_and_grad (\d\.\d+)", out)
    theirs = number(r", nnx\.value_and_grad (\d\.\d+)", out)
    assert ours == theirs == pytest.approx(accuracy, abs=5e-5)  # same seed, gradients equal to float precision
    assert number(r"max \|gradient difference\| over all steps (\S+)\)", out) <= 1e-6
    assert math.isfinite(number(r"final loss (\S+),", last))
    assert f"test accuracy {accuracy:.4f}" in last


def test_transformer_short(capsys):
    argv = ["--steps", "2", "--layers", "1", "--dim", "16", "--heads", "2", "--context", "16", "--batch", "4", "--sample", "8",
            "--budget", "0.5"]  # fmt: skip
    loss, out, last = run("train_transformer", argv, capsys)
    assert math.isfinite(loss) and 0 < loss < 10  # cross-entropy over a vocabulary of ~60 characters
    assert math.isfinite(number(r"validation loss (\S+),", last))
    assert "trace-cache hits 1/2" in last  # the second step reuses the first step's trace
    assert re.search(r"^sample: The .{8}$", out, re.MULTILINE)


def test_treelstm_retraces_per_shape_within_a_byte_budget(capsys):
    argv = ["--steps", "4", "--shapes", "3", "--min-leaves", "2", "--max-leaves", "6", "--hidden", "16", "--embed", "8",
            "--batch", "8", "--budget", "0.7"]  # fmt: skip
    loss, out, last = run("treelstm", argv, capsys)
    assert math.isfinite(loss)
    assert re.search(r"the largest tree's unconstrained peak .+ > budget ", out)  # a plain run would not fit
    retraces, hits = number(r"re-traces (\d+)", last), number(r"trace-cache hits (\d+)", last)
    assert retraces >= 1 and hits >= 1 and retraces + hits == 4  # the first step's tree was traced by the probe
    assert "max |jdtr - jax.grad| = 0.00e+00" in last


def test_higher_order_matches_jax_grad(capsys):
    # Tiny second-order programs need a generous budget: rematerializing a long chain locks its inputs.
    argv = ["--steps", "2", "--tasks", "2", "--points", "64", "--inner-steps", "2", "--width", "16", "--budget", "0.7"]
    loss, out, last = run("higher_order", argv, capsys)
    assert math.isfinite(loss)
    assert number(r"max \|jdtr - jax\.grad\| = (\S+)$", last) <= 1e-6
    assert "2 unrolled inner steps" in last


def test_nnx_jit_example_trains_with_the_compiled_path_within_the_budget(capsys):
    argv = ["--steps", "2", "--layers", "16", "--width", "64", "--batch", "2048", "--budget", "0.6"]
    loss = load("train_nnx_jit").main(argv)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert math.isfinite(loss) and f"final loss {loss:.4f}" in last
    assert number(r", (\d\.\d+) of the budget", last) <= 1.0
    assert number(r"max \|jdtr - nnx\.grad\| = (\S+);", last) <= 1e-6
    planned, plain = number(r"step (\d+\.\d+) MiB", last), number(r"jax\.grad (\d+\.\d+) MiB", last)
    assert planned < 0.7 * plain


@pytest.mark.parametrize("name", ["train_mlp", "train_cnn_digits", "train_transformer", "treelstm", "higher_order", "train_nnx_jit"])
def test_help(name, capsys):
    with pytest.raises(SystemExit) as info:
        load(name).main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "--budget" in text and "--steps" in text
