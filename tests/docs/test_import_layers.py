"""The import graph of ``src/cadence``: no cycle of modules, no cycle of packages, and no import from a lower floor
up to a higher one (the floors are drawn in docs/architecture.md).

Every ``import``/``from ... import`` anywhere in a module's source (top level, inside functions, under
``TYPE_CHECKING``) is an edge to the cadence module it names. A cycle, even one held together by an import
deferred into a function, means a piece sits on the wrong floor. ``FLOORS`` states the floors, lowest first, by
package (``cadence.backend``, ``cadence.checkpoint``, ...; a module directly in ``cadence/`` is a package of its own
here): a package imports packages of its own floor or below, never above, and no packages import each other in a
circle (an import deferred into a function to keep ``import cadence`` fast is still an edge, and still only goes
down). Inside a package, the module graph has no cycle either.
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


# The floors of cadence, lowest first: (name, the packages on it). A package is ``cadence.<name>``: a folder with its
# modules, or a module directly in cadence/ (the ``cadence`` entry is the package's own __init__). Every module of a
# package sits on the package's floor: a package is wholly above or below every other.
FLOORS = [
    ("device and process facts", ["cadence.version", "cadence.versions", "cadence.peft_support", "cadence.runtime"]),
    ("checkpoint files and public helpers", ["cadence.checkpoint_io", "cadence.trainer_state", "cadence.trainer_utils",
                                             "cadence.search_types", "cadence.column_removal", "cadence.memory_metrics",
                                             "cadence.checks"]),
    ("the loop's parts", ["cadence.callback_events", "cadence.progress", "cadence.trainer_callback", "cadence.data",
                          "cadence.optimization", "cadence.loss", "cadence.evaluation", "cadence.loop_state",
                          "cadence.output_guard"]),
    ("checkpoints", ["cadence.checkpoint"]),  # the Checkpointer, the atomic writer, the manifest, resume, signals
    ("engines", ["cadence.backend"]),  # precision, FSDP, meshes, DeepSpeed, the Backend and trainer.accelerator
    ("features", ["cadence.activation_checkpointing", "cadence.neftune", "cadence.overflow", "cadence.liger",
                  "cadence.hub", "cadence.model_card", "cadence.script_metrics", "cadence.hyperparameter_search",
                  "cadence.integrations"]),
    ("arguments", ["cadence.training_args_types", "cadence.training_args_checks", "cadence.training_args_parsing",
                   "cadence.training_args", "cadence.training_args_seq2seq"]),
    ("the Trainer", ["cadence.trainer_surface", "cadence.trainer", "cadence.trainer_seq2seq"]),
    ("entry points and transformers' paths", ["cadence", "cadence.trainer_pt_utils", "cadence.trainer_jit_checkpoint",
                                              "cadence.trainer_optimizer", "cadence.patch", "cadence.cli",
                                              "cadence.cli_train", "cadence.cli_env", "cadence.demo", "cadence.plot",
                                              "cadence.__main__"]),
]


def package_of(module: str) -> str:
    """``cadence.checkpoint.writer`` -> ``cadence.checkpoint``; ``cadence.trainer`` -> itself; ``cadence`` -> itself."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``{package: the other packages its modules import}``: the module graph with each package's modules merged."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = packages.setdefault(package_of(module), set())
        edges.update(package_of(t) for t in targets if package_of(t) != package_of(module))
    return packages


def floor_of(package: str, floors: list = FLOORS) -> int | None:
    """The index of the floor that names ``package``, or None."""
    return next((index for index, (_, names) in enumerate(floors) if package in names), None)


def upward_imports(graph: dict[str, set[str]], floors: list = FLOORS) -> list[str]:
    """Every edge of the package graph of ``graph`` from a package to one on a higher floor, as
    "low (floor) -> high (floor)"."""
    packages, found = package_graph(graph), []
    for package in sorted(packages):
        for target in sorted(packages[package]):
            if floor_of(target, floors) > floor_of(package, floors):
                found.append(f"{package} ({floors[floor_of(package, floors)][0]}) -> "
                             f"{target} ({floors[floor_of(target, floors)][0]})")
    return found


def test_every_module_is_on_a_floor():
    unplaced = sorted(m for m in import_graph() if floor_of(package_of(m)) is None)
    assert unplaced == []


def test_no_package_imports_a_package_above_it():
    graph = import_graph()
    assert "cadence.runtime.devices" in graph and "cadence.optimization.schedules" in graph  # the packages were read
    assert "cadence.checkpoint_io" in package_graph(graph)["cadence.backend"]  # and their edges
    assert upward_imports(graph) == []


def test_no_circle_of_packages_counting_deferred_imports():
    """Two packages never import each other, directly or around a circle: each sits wholly above or below the other
    (``from ..pkg import X`` is never an upward import)."""
    packages = package_graph(import_graph())
    assert len(packages) > 30 and {"cadence.backend", "cadence.checkpoint", "cadence.checkpoint_io"} <= set(packages)
    found = cycles(packages)
    assert found == [], {tuple(c): {p: sorted(packages[p] & set(c)) for p in c} for c in found}


def test_the_package_check_finds_a_circle_of_packages(tmp_path):
    """The test above cannot pass by seeing nothing: two packages with no module cycle, whose modules import each
    other's package (one of the imports deferred into a function), are a circle of packages."""
    package = tmp_path / "cadence"
    for name in ("engine", "files"):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "engine" / "strategy.py").write_text("from ..files import formats\n")
    (package / "files" / "formats.py").write_text("def f():\n    return 1\n")
    (package / "files" / "writer.py").write_text("def g():\n    from ..engine import strategy  # deferred\n    return strategy\n")
    graph = import_graph(package)
    assert cycles(graph) == []  # module by module there is no cycle
    assert cycles(package_graph(graph)) == [["cadence.engine", "cadence.files"]]


def test_the_floor_check_finds_an_import_up(tmp_path):
    """The test above cannot pass by seeing nothing: a low module whose function imports a high one is reported."""
    package = tmp_path / "cadence"
    (package / "engine").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "engine" / "__init__.py").write_text("from .devices import f\n")
    (package / "engine" / "devices.py").write_text("def f():\n    return 1\n")
    (package / "helpers.py").write_text("def g():\n    from .engine.devices import f  # down: fine\n    return f\n")
    (package / "loop.py").write_text("from . import helpers\n")
    floors = [("low", ["cadence.engine", "cadence.helpers"]),
              ("high", ["cadence", "cadence.loop"])]
    assert upward_imports(import_graph(package), floors) == []
    (package / "helpers.py").write_text("def g():\n    from .loop import helpers  # up, deferred\n    return helpers\n")
    assert upward_imports(import_graph(package), floors) == ["cadence.helpers (low) -> cadence.loop (high)"]
    (package / "engine" / "devices.py").write_text("def f():\n    from ..loop import helpers  # a package's module, up\n")
    (package / "helpers.py").write_text("def g():\n    return 1\n")
    assert upward_imports(import_graph(package), floors) == ["cadence.engine (low) -> cadence.loop (high)"]


def test_importing_a_low_floor_never_pulls_in_the_trainer():
    """What the low floors reach, transitively, never includes the Trainer or the checkpoint's save/load."""
    graph = import_graph()
    for module in ["cadence.trainer_utils", "cadence.backend", "cadence.data", "cadence.optimization",
                   "cadence.checkpoint_io.formats", "cadence.checkpoint"]:
        reached, todo = set(), [module]
        while todo:  # everything the module reaches, transitively
            for nxt in graph[todo.pop()]:
                if nxt not in reached:
                    reached.add(nxt)
                    todo.append(nxt)
        assert not any(m.startswith(("cadence.trainer", "cadence.checkpoint.save_load")) and m != "cadence.trainer_utils"
                       for m in reached), (module, sorted(reached))


def test_the_checkpoint_package_imports_neither_data_nor_the_loop_state():
    """The data side of a resume (the sampler past the trained batches, a stream's state, the RNGs set around the
    epoch's first fetch) is data/'s; the checkpoint package only says which checkpoint and which position."""
    graph = import_graph()
    assert "cadence.checkpoint.resume" in graph
    found = sorted(f"{module} -> {target}" for module in graph if module.startswith("cadence.checkpoint")
                   for target in graph[module]
                   if target in ("cadence.data", "cadence.loop_state") or target.startswith("cadence.data."))
    assert found == []


def test_every_module_imports_on_its_own():
    """Each module of the package imports first in a fresh interpreter (no hidden order dependence)."""
    import subprocess
    import sys

    names = sorted(n for n in import_graph() if n.startswith(("cadence.checkpoint", "cadence.backend", "cadence.data",
                                                              "cadence.optimization", "cadence.runtime")) or n in (
        "cadence.trainer_utils", "cadence.trainer_state", "cadence.loop_state", "cadence.output_guard",
        "cadence.integrations.base", "cadence.integrations.registry", "cadence.model_card"))
    # one interpreter; before each module, every cadence module is forgotten, so each is the first one imported
    code = ("import importlib, sys\nfor n in sys.argv[1:]:\n"
            "    for m in [m for m in sys.modules if m == 'cadence' or m.startswith('cadence.')]:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module(n)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
