"""The Backend never asks which engine runs: one strategy object per engine carries the verbs, picked once at set-up,
and the adapter's verbs only hand each call to it (DESIGN.md, "backend/"; style rule 5). Read from the source (AST):
a verb of ``Backend`` whose condition names the engine (``deepspeed``, ``sharding``, ``engine``, ``accelerator``, ...)
or asks ``isinstance`` fails here. The engines' behaviour is guarded by their end-to-end tests (test_ddp.py,
test_fsdp.py, test_tensor_parallel.py, test_deepspeed_train.py, test_precision.py)."""

import ast
import importlib
import inspect
from pathlib import Path

import cadence.backend
from cadence import TrainingArguments
from cadence.backend import Backend, Precision, Strategy

BACKEND = Path(cadence.backend.__file__).parent
# what a condition may not ask in a verb: which engine runs, or whether there are several processes
ENGINE_WORDS = {"deepspeed", "sharding", "engine", "accelerator", "strategy", "layout", "world_size", "is_fsdp",
                "plugin", "isinstance"}
STRATEGY_MODULES = ["single", "ddp", "fsdp", "meshes", "deepspeed_engine"]  # one engine each


def _names(node: ast.AST) -> set[str]:
    return {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(node)
            if isinstance(n, (ast.Attribute, ast.Name))}


def engine_branches(source: str, cls: str = "Backend") -> list[str]:
    """Every condition in ``cls``'s methods and class-level expressions (``__init__``, the set-up, excepted) that
    names an engine word: ``if``/``elif``, ``x if c else y``, ``and``/``or``, ``while``, comprehension filters."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        for member in node.body:
            if isinstance(member, ast.FunctionDef) and member.name == "__init__":
                continue
            for inner in ast.walk(member):
                tests = ([inner.test] if isinstance(inner, (ast.If, ast.IfExp, ast.While)) else
                         inner.values if isinstance(inner, ast.BoolOp) else
                         inner.ifs if isinstance(inner, ast.comprehension) else [])
                for test in tests:
                    words = _names(test) & ENGINE_WORDS
                    if words:
                        where = member.name if isinstance(member, ast.FunctionDef) else f"line {member.lineno}"
                        found.append(f"{where}: {ast.unparse(test)}")
    return found


def test_the_adapters_verbs_never_branch_on_the_engine_and_it_stays_small():
    source = (BACKEND / "adapter.py").read_text()
    assert engine_branches(source) == []
    assert len(source.splitlines()) <= 250


def test_the_check_sees_a_branch_on_the_engine():
    """The test above cannot pass by seeing nothing: each kind of question about the engine is found."""
    source = '''
class Backend:
    def __init__(self, args):
        self.deepspeed = args.deepspeed if args.deepspeed else None  # set-up may choose
    def backward(self, loss):
        if self.engine is not None:
            return
        self.accelerator.backward(loss) if self.accelerator else loss.backward()
    shards = property(lambda self: self.sharding is not None or False)
    def clip(self, p):
        return [q for q in p if isinstance(self.strategy, object)]
'''
    assert [line.split(":")[0] for line in engine_branches(source)] == ["backward", "backward", "line 9", "clip"]


def test_one_strategy_per_module_each_with_the_verbs_the_loop_uses():
    """A new engine is one new module: each strategy module holds one engine, which answers prepare, backward and
    clipping itself (the rest have one process's defaults in ``Strategy``)."""
    engines = {}
    for name in STRATEGY_MODULES:
        module = importlib.import_module(f"cadence.backend.{name}")
        classes = [c for _, c in inspect.getmembers(module, inspect.isclass)
                   if issubclass(c, Strategy) and c.__module__ == module.__name__]
        assert len(classes) == 1, (name, classes)
        engines[name] = classes[0]
    for name, engine in engines.items():
        for verb in ("prepare", "backward", "clip_grad_norm"):
            assert getattr(engine, verb) is not getattr(Strategy, verb), (name, verb)


def test_one_process_gets_the_single_device_strategy_and_a_precision(tmp_path):
    backend = Backend(TrainingArguments(str(tmp_path), use_cpu=True, bf16=True, report_to="none"))
    assert type(backend.strategy).__name__ == "SingleDevice" and isinstance(backend.precision, Precision)
    assert backend.accelerator is None and backend.sharding is None and backend.deepspeed is None
    assert backend.amp_dtype is backend.precision.amp_dtype and backend.scaler is None  # bf16: no loss scaling
