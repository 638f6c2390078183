"""The architecture as the imports show it: the layer map of docs/design.md holds.

Read from the source (no module is imported), so that a new import that runs
back up a layer, a cycle, a reach into another module's private names, or a
module grown past a few hundred lines fails here, with the line that did it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import jdtr

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jdtr"
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer_map() -> dict[str, tuple[int, str]]:
    """docs/design.md's table: `| layer | modules | ... |` rows, the modules as `jdtr.x` names."""
    rows = {}
    text = (ROOT / "docs" / "design.md").read_text()
    for line in text.splitlines():
        match = re.match(r"\|\s*(\d)([a-z]?)\s*\|([^|]*)\|", line)
        if match:
            for name in re.findall(r"`(jdtr[\w.]*)`", match.group(3)):
                rows[name] = (int(match.group(1)), match.group(2))
    return rows


LAYERS = _layer_map()


def _layer_of(module: str) -> tuple[int, str]:
    """The layer of the longest prefix of `module` in the map."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        found = LAYERS.get(".".join(parts[:end]))
        if found is not None:
            return found
    raise AssertionError(f"{module} is in no layer of docs/design.md")


def _imports(module: str) -> list[tuple[str, list[str], int]]:
    """(imported jdtr module, names taken from it, line) for every import of
    `module`, TYPE_CHECKING blocks and imports inside functions included."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "jdtr"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "jdtr":
                continue
            names = [a.name for a in node.names]
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            if submodules:
                found += [(s, [], node.lineno) for s in submodules]
            else:
                found.append((target, names, node.lineno))
    return found


def test_every_module_is_in_a_layer():
    assert LAYERS, "docs/design.md has no layer table"
    for module in MODULES:
        _layer_of(module)


def test_no_import_runs_back_up_a_layer():
    wrong = []
    for module in MODULES:
        here = _layer_of(module)
        for target, _, line in _imports(module):
            if module.startswith(target + ".") or target == module:
                continue  # a package's own __init__ (importing jdtr.x.y runs jdtr.x)
            there = _layer_of(target)
            if there[0] > here[0] or (there[0] == here[0] and there[1] and here[1] and there[1] != here[1]):
                wrong.append(f"{MODULES[module].relative_to(ROOT)}:{line}: layer {here} imports {target} (layer {there})")
    assert not wrong, "\n".join(wrong)


def test_no_two_modules_import_each_other():
    graph = {m: {t for t, _, _ in _imports(m) if t in MODULES and t != m} for m in MODULES}

    def package_of(m):  # a module always sees its package's __init__; that is not a loop
        return {m.rsplit(".", k)[0] for k in range(1, m.count(".") + 1)}

    for module, targets in graph.items():
        graph[module] = {t for t in targets if t not in package_of(module)}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(t):] + [t]))
            if t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_no_module_takes_another_modules_private_names():
    wrong = []
    for module in MODULES:
        for target, names, line in _imports(module):
            private_module = any(p.startswith("_") and p != "__init__" for p in target.split(".")[1:])
            parent = target.rpartition(".")[0]
            outside = private_module and not (module == parent or module.startswith(parent + "."))
            if outside:
                wrong.append(f"{module}:{line} imports the private module {target}")
            if target != module:
                wrong += [f"{module}:{line} takes {n} from {target}" for n in names if n.startswith("_")]
    assert not wrong, "\n".join(wrong)


def test_the_runtime_knows_nothing_of_jax():
    for module, path in MODULES.items():
        if 1 <= _layer_of(module)[0] <= 3:
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    assert not any(n.split(".")[0] in ("jax", "jaxlib") for n in names), (module, node.lineno)


def test_only_the_jax_core_module_touches_jax_internals():
    pattern = re.compile(r"\bjax\.(core|_src|extend|interpreters)\b|from jax\._src|from jax\.extend")
    touching = [
        f"{path.relative_to(ROOT)}:{n}"
        for module, path in MODULES.items()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and module != "jdtr.transform._jax_core"
    ]
    assert not touching, touching


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)} has {lines} lines"


def test_no_attribute_of_jdtr_shadows_a_subpackage():
    for module in MODULES:
        parts = module.split(".")
        if len(parts) == 2 and hasattr(jdtr, parts[1]):
            attribute = getattr(jdtr, parts[1])
            assert getattr(attribute, "__name__", None) == module, f"jdtr.{parts[1]} is not the module {module}"


def test_the_log_format_is_exported_by_its_new_name():
    assert jdtr.trace.__module__ == "jdtr.transform.gradients" and callable(jdtr.trace)
    assert jdtr.Trace is jdtr.oplog.Trace and jdtr.TraceRecorder is jdtr.oplog.TraceRecorder
