"""Examples run in a short mode and report what they promise."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_mlp_short(capsys):
    loss = load("train_mlp").main(["--steps", "3", "--layers", "8", "--width", "32", "--batch", "256", "--budget", "0.5"])
    out = capsys.readouterr().out
    assert loss == pytest.approx(loss) and loss < 1.0
    assert "max |jdtr - jax.grad| = 0.00e+00" in out
    assert "<= budget" in out


def test_train_mlp_help(capsys):
    with pytest.raises(SystemExit) as info:
        load("train_mlp").main(["--help"])
    assert info.value.code == 0
    assert "--budget" in capsys.readouterr().out
