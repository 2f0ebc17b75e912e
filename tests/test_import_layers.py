"""The module graph of ``src/cadence`` has no cycle, counting imports deferred into functions (issue 21).

Every ``import``/``from ... import`` anywhere in a module's source (top level, inside functions, under
``TYPE_CHECKING``) is an edge to the cadence module it names. A cycle, even one held together by an import
deferred into a function, means a piece sits on the wrong floor (DESIGN.md, "Layers").
"""

import ast
import os
from pathlib import Path

import pytest

import cadence

ROOT = Path(cadence.__file__).parent


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``{module: the cadence modules its source imports}``, from the AST (nothing is imported to build it)."""
    paths = {module_name(p, root): p for p in root.rglob("*.py")}
    graph = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in paths]
                targets = submodules or [base]  # `from . import x` names module x; `from .m import f` names m
            else:
                continue
            graph[name].update(t for t in targets if t in paths and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_in_cadence_counting_deferred_imports():
    graph = import_graph()
    assert len(graph) > 50 and "cadence.checkpoint.writer" in graph  # the walk saw the package
    found = cycles(graph)
    edges = {tuple(c): {m: sorted(graph[m] & set(c)) for m in c} for c in found}
    assert found == [], edges


def test_the_checker_finds_a_cycle_made_of_a_deferred_import(tmp_path):
    """The test above cannot pass by seeing nothing: a two-module package whose cycle closes inside a function."""
    package = tmp_path / "cadence"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from .high import g  # deferred\n    return g\n")
    (package / "high.py").write_text("from . import low\n\ndef g():\n    return low\n")
    assert cycles(import_graph(package)) == [["cadence.high", "cadence.low"]]


@pytest.mark.parametrize("module, allowed", [
    # backend knows devices and processes; of checkpoints only the file formats (the bottom layer)
    ("cadence.backend", {"cadence.checkpoint.formats", "cadence.checkpoint.sharded", "cadence.checkpoint.deepspeed_files"}),
    # transformers' public helpers: nothing of cadence's above them but the memory tracker and backend's device facts
    ("cadence.trainer_utils", {"cadence.memory_metrics", "cadence.backend"}),
    # the bottom layer of the checkpoint package
    ("cadence.checkpoint.formats", {"cadence.peft_support"}),
    ("cadence.checkpoint.deepspeed_files", {"cadence.checkpoint.formats"}),
    ("cadence.checkpoint", set()),  # importing a layer never pulls in the package's top
])
def test_the_low_layers_import_only_what_is_below_them(module, allowed):
    graph = import_graph()
    reached, todo = set(), [module]
    while todo:  # everything the module reaches, transitively
        for nxt in graph[todo.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    assert graph[module] <= allowed, sorted(graph[module] - allowed)
    assert not any(m.startswith(("cadence.trainer", "cadence.checkpoint.save_load")) and m != "cadence.trainer_utils"
                   for m in reached), sorted(reached)


def test_every_module_imports_on_its_own():
    """Each module of the package imports first in a fresh interpreter (no hidden order dependence)."""
    import subprocess
    import sys

    names = sorted(n for n in import_graph() if n.startswith("cadence.checkpoint") or n in (
        "cadence.backend", "cadence.trainer_utils", "cadence.data", "cadence.loop_state", "cadence.output_guard",
        "cadence.integrations.base", "cadence.integrations.registry", "cadence.model_card"))
    # one interpreter; before each module, every cadence module is forgotten, so each is the first one imported
    code = ("import importlib, sys\nfor n in sys.argv[1:]:\n"
            "    for m in [m for m in sys.modules if m == 'cadence' or m.startswith('cadence.')]:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module(n)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
