"""Executes the notebooks in place, so that they are committed with their
outputs (tables and figures show on GitHub and in any viewer).

    make notebooks        # or: .venv/bin/python notebooks/execute.py [NAME.ipynb ...]

Each runs top to bottom on a kernel of this interpreter (a kernel spec
written to a temporary directory points at `sys.executable`), in
notebooks/, as Jupyter runs it; figures the notebooks save go to a
temporary directory (`JDTR_FIGURES`). `tests/test_notebooks.py` runs them
again and checks what they show.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile

import nbclient
import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

NOTEBOOKS = pathlib.Path(__file__).resolve().parent
KERNEL = "jdtr-notebooks"


def execute(path: pathlib.Path, kernels: pathlib.Path, figures: pathlib.Path) -> None:
    nb = nbformat.read(path, as_version=4)
    manager = KernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))
    client = nbclient.NotebookClient(
        nb, km=manager, timeout=600, allow_errors=False, record_timing=False,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute(env={**os.environ, "JDTR_FIGURES": str(figures), "JUPYTER_PLATFORM_DIRS": "1"})
    nbformat.validate(nb)
    nbformat.write(nb, path)


def main(names: list[str]) -> None:
    paths = [NOTEBOOKS / n for n in names] if names else sorted(NOTEBOOKS.glob("*.ipynb"))
    with tempfile.TemporaryDirectory() as tmp:
        kernels, figures = pathlib.Path(tmp, "kernels"), pathlib.Path(tmp, "figures")
        (kernels / KERNEL).mkdir(parents=True)
        figures.mkdir()
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        (kernels / KERNEL / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "jdtr", "language": "python"}))
        for path in paths:
            print(f"executing {path.name} ...", flush=True)
            execute(path, kernels, figures)


if __name__ == "__main__":
    main(sys.argv[1:])
