"""The JAX versions jdtr declares are the ones it is tested with.

`pyproject.toml` bounds JAX on both sides so that an install never pulls a
JAX no one has run the suite on. These tests keep the declaration and the
testing in step: the JAX running the suite is inside the declared range
(CI installs the newest its index serves, so a new JAX there fails here
before it is declared), the oldest-JAX run (`make test-oldest-jax`)
installs the declared lower bound, and the CUDA extra declares the same
range as the plain dependency.
"""

from __future__ import annotations

import os
import re

import jax
import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
from packaging.requirements import Requirement  # noqa: E402 - pytest's own dependency
from packaging.version import Version  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)


def _project() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _jax_requirements() -> list[Requirement]:
    project = _project()
    declared = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [req for req in map(Requirement, declared) if req.name == "jax"]


def test_the_running_jax_is_in_the_declared_range():
    (plain,) = [req for req in _jax_requirements() if not req.extras]
    assert Version(jax.__version__) in plain.specifier, (jax.__version__, str(plain.specifier))
    assert any(spec.operator == "<" for spec in plain.specifier), "no upper bound: an install could pull an untested JAX"


def test_every_declaration_of_jax_has_the_same_range():
    ranges = {str(req.specifier) for req in _jax_requirements()}
    assert len(ranges) == 1, ranges


def test_the_oldest_jax_tested_is_the_declared_lower_bound():
    with open(os.path.join(ROOT, "Makefile")) as f:
        (oldest,) = re.findall(r"^OLDEST_JAX := (\S+)$", f.read(), flags=re.M)
    (plain,) = [req for req in _jax_requirements() if not req.extras]
    (lower,) = [spec for spec in plain.specifier if spec.operator == ">="]
    assert Version(oldest) == Version(lower.version), (oldest, lower.version)
    assert Version(oldest) in plain.specifier
