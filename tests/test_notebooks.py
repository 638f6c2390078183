"""The notebooks run top to bottom (nbclient) and show what they claim.

Each runs on a kernel of this very interpreter: a kernel spec written at test
time points at `sys.executable`, so a fresh clone where only
`pip install -e .[dev]` ran uses the venv's Python, whatever other "python3"
kernels the machine knows. The kernel's working directory is notebooks/, as
in Jupyter; figures the notebooks save go to a temporary directory
(`JDTR_FIGURES`), not into docs/.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
KERNEL = "jdtr-tests"


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> pathlib.Path:
    """A directory holding one kernel spec: this interpreter running ipykernel."""
    root = tmp_path_factory.mktemp("kernels")
    spec = root / KERNEL
    spec.mkdir()
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "jdtr tests", "language": "python"}))
    return root


def execute(name: str, kernels: pathlib.Path, figures: pathlib.Path):
    """Runs notebooks/`name` in a fresh kernel; returns the executed notebook and its text output."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    manager = KernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))
    client = nbclient.NotebookClient(
        nb, km=manager, timeout=600, allow_errors=False, resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    env = {**os.environ, "JDTR_FIGURES": str(figures), "JUPYTER_PLATFORM_DIRS": "1"}
    client.execute(env=env)
    text = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                text.append(output["text"])
            elif output.get("output_type") == "error":  # allow_errors=False raises first; kept for clarity
                text.append("ERROR " + output["ename"])
    return nb, "".join(text)


def images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for cell in nb.cells for o in cell.get("outputs", []))


def test_notebooks_are_committed_executed():
    """Committed with their outputs (`make notebooks`), so tables and figures
    show on GitHub: every code cell run once, in order, without errors, and
    a figure in each."""
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert [c.get("execution_count") for c in code] == list(range(1, len(code) + 1)), path
        assert not any(o.get("output_type") == "error" for c in code for o in c.get("outputs", [])), path
        assert images(nb) >= 1, path


def test_quickstart(kernels, tmp_path):
    nb, text = execute("01_quickstart.ipynb", kernels, tmp_path)
    assert "max |jdtr.grad - jax.grad| = 0.0e+00" in text
    for budget in ("1.0", "0.7", "0.5", "0.35", "2MiB"):
        assert re.search(rf"budget +{re.escape(budget)}: peak ", text)
    assert "fits: it was verified by simulating the run" in text  # the OutOfBudgetError cell
    match = re.search(r"backward pass from step (\d+)", text)
    assert match and int(match.group(1)) > 1
    assert images(nb) >= 1
    saved = tmp_path / "quickstart_timeline.png"
    assert saved.exists() and saved.stat().st_size > 10_000


@pytest.mark.long
def test_vs_jax_checkpoint(kernels, tmp_path):
    nb, text = execute("02_vs_jax_checkpoint.ipynb", kernels, tmp_path)
    assert "machine:" in text and "JAX " in text
    rows = {}
    for line in text.splitlines():
        match = re.match(r"(.+?)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)$", line)
        if match:
            rows[match.group(1)] = float(match.group(3))  # memory relative to jax.grad
    assert rows["jax.grad"] == 1.0
    assert rows["checkpoint per block, nothing_saveable"] < 1.0
    for budget in ("0.7", "0.5", "0.35"):
        # a compiled plan fits its budget (a fraction of jax.grad's compiled memory), eager jdtr its own
        assert rows[f"jdtr.remat_grad {budget}"] <= float(budget) + 1e-9
        assert rows[f"jdtr.grad {budget}"] < 1.0
    assert images(nb) == 1


def test_heuristics(kernels, tmp_path):
    nb, text = execute("03_heuristics.ipynb", kernels, tmp_path)
    assert re.search(r"^dtr_eq\s+1\.\d{4}", text, re.MULTILINE)
    # The shipped log's sweep, cell by cell as the simulator gives it here
    # (the notebook reads nothing outside the repository).
    from jdtr.simulator import format_table, sweep

    ratios = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1)
    shipped = ROOT / "examples" / "data" / "transformer-2x32.log"
    assert "swept transformer-2x32.log" in text
    table = text.split("swept transformer-2x32.log", 1)[1]
    for heuristic in ("dtr_eq", "msps"):
        row = re.search(rf"^{heuristic}\s+(.+)$", table, re.MULTILINE).group(1).split()
        expected = format_table(ratios, sweep(shipped, ratios, (heuristic,))).splitlines()[1].split()[1:]
        assert row == expected, heuristic
    assert images(nb) == 1
