"""The import paths users and cadence's own tests, docs and scripts take into backend/, data/ and optimization/
still work after those modules became packages: every name ``transformers.optimization`` defines, and every
name imported from ``cadence.backend``, ``cadence.data`` or ``cadence.optimization`` anywhere in the repository."""

import importlib
import re
from pathlib import Path

import pytest
from repo_paths import REPO

ROOT = Path(REPO)

# transformers.optimization names cadence has never had (not a regression of the packages; each a feature of its own)
NOT_IN_CADENCE = {
    "LayerWiseDummyOptimizer": "layer-wise optimizers are cadence's LayerwiseOptimizer, not transformers' dummies",
    "LayerWiseDummyScheduler": "the same",
    "StreamingAverage": "GreedyLR's rolling mean is private in cadence (same state_dict keys)",
}


def transformers_optimization_names():
    transformers_optimization = pytest.importorskip("transformers.optimization")
    return sorted(name for name, value in vars(transformers_optimization).items()
                  if not name.startswith("_") and getattr(value, "__module__", "").startswith("transformers"))


def test_every_name_of_transformers_optimization_imports_from_cadence_optimization():
    names = transformers_optimization_names()
    assert {"get_linear_schedule_with_warmup", "Adafactor", "get_scheduler", "SchedulerType"} <= set(names)
    optimization = importlib.import_module("cadence.optimization")
    missing = [name for name in names if name not in NOT_IN_CADENCE and not hasattr(optimization, name)]
    assert missing == []


def repository_imports():
    """``(module, name)`` for each ``from cadence.<backend|data|optimization> import name`` (or ``from .backend
    import``, ``from ..data import`` inside src/cadence) in src/, tests/, docs/, README.md, benchmarks/, scripts/."""
    files = [ROOT / "README.md", *(p for folder in ("src", "tests", "docs", "benchmarks", "scripts")
                                   for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md"))]
    pattern = re.compile(r"from\s+(?:cadence|\.+)\.?(backend|data|optimization)\s+import\s+(\([^)]*\)|[^\n]*)")
    found = set()
    for path in files:
        if "cadence" in path.parts and path.parent.name in ("backend", "data", "optimization"):
            continue  # the packages' own modules
        for module, names in pattern.findall(path.read_text(encoding="utf-8", errors="ignore")):
            for name in re.sub(r"#[^\n]*", "", names).strip("()").split(","):
                name = name.split(" as ")[0].strip()
                if name and name not in ("*",) and name.isidentifier():
                    found.add((f"cadence.{module}", name))
    return sorted(found)


def test_the_scan_sees_the_repository():
    found = repository_imports()
    assert ("cadence.backend", "Backend") in found and ("cadence.data", "default_data_collator") in found
    assert ("cadence.optimization", "get_scheduler") in found and len(found) > 30


@pytest.mark.parametrize("module, name", repository_imports())
def test_each_imported_name_still_imports(module, name):
    package = importlib.import_module(module)
    if not hasattr(package, name):  # a submodule of the package, `from cadence.backend import devices`
        importlib.import_module(f"{module}.{name}")


# names read as attributes (``backend.any_process``, ``data.count_items``, ``optimization._LOW_RANK``) by tests/ and
# scripts/, which the scan above does not see
ATTRIBUTES = {
    "cadence.backend": ["Backend", "_EMPTY_CACHE", "_process_group_options", "accelerator_available", "any_process",
                        "default_device", "device_rng_state", "set_device_rng_state", "free_memory", "peak_flops",
                        "process_group_size_and_rank", "fsdp_plugin", "deepspeed_config", "torch"],
    "cadence.data": ["DistributedLengthGroupedSampler", "EpochSampler", "IterableShard", "LengthGroupedSampler",
                     "TokenCounter", "count_items", "batch_items", "default_data_collator", "length_grouped_indices"],
    "cadence.optimization": ["OPTIMIZERS", "SCHEDULERS", "TYPE_TO_SCHEDULER_FUNCTION", "_LOW_RANK", "_NOT_BUILT",
                             "_OPTIONAL_PACKAGES", "_package_available", "LayerwiseOptimizer", "parse_optim_args"],
}


@pytest.mark.parametrize("module, name", [(m, n) for m, names in ATTRIBUTES.items() for n in names])
def test_each_attribute_still_reads(module, name):
    assert hasattr(importlib.import_module(module), name)
