"""``cadence env``: the facts a bug report needs, as ``transformers env`` and ``accelerate env`` print them.

Versions are read from the installed packages' metadata (nothing is imported but torch, for the devices); the
optional packages are the ones cadence's extras name, so the list follows pyproject.toml.
"""

from __future__ import annotations

import os
import platform
import re
import sys


def installed_version(name: str) -> str | None:
    """The installed version of the distribution ``name``, or None; reads metadata only (imports nothing)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# the core dependencies (pyproject's `dependencies`), named first; the extras' packages follow
CORE = ("torch", "accelerate", "safetensors", "numpy", "tqdm")


def optional_packages() -> list[str]:
    """The distributions cadence's extras name (``peft``, ``deepspeed``, ``trl``, ...), in their order, from cadence's
    installed metadata; empty when cadence runs from a source folder without being installed."""
    from importlib import metadata

    try:
        requirements = metadata.requires("cadence") or []
    except metadata.PackageNotFoundError:
        return []
    names = []
    for requirement in requirements:
        if "extra ==" not in requirement:
            continue
        name = re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)
        if name not in names and name not in (*CORE, "transformers", "pytest"):
            names.append(name)
    return names


def _cadence_install() -> str:
    """Where the imported cadence lives and how it was installed (a wheel, an editable install, a source folder)."""
    import json
    from importlib import metadata

    from .version import __version__

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        distribution = metadata.distribution("cadence")
    except metadata.PackageNotFoundError:
        return f"{__version__}, imported from {here} (not installed: a source folder on PYTHONPATH)"
    direct = json.loads(distribution.read_text("direct_url.json") or "{}")
    how = "editable install" if direct.get("dir_info", {}).get("editable") else "installed"
    return f"{__version__}, imported from {here} ({how} {distribution.version})"


def _hook_state() -> str:
    from .patch import ENV, PTH, hook_installed

    installed = f"{PTH} installed" if hook_installed() else f"{PTH} missing (child processes of `cadence run` " \
                                                            "would train on transformers)"
    return f"{installed}; {ENV}={os.environ.get(ENV, '')!r}"


def environment_report() -> str:
    """The report ``cadence env`` prints: one ``- name: value`` line each, ready to paste into an issue."""
    import torch

    from .runtime.devices import describe_devices

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    lines = [
        f"cadence: {_cadence_install()}",
        f"start-up hook: {_hook_state()}",
        f"python: {platform.python_version()} ({sys.executable})",
        f"platform: {platform.platform()}",
        f"torch: {torch.__version__} ({build} build)",
        f"devices: {describe_devices()}",
    ]
    for name in ("transformers", *CORE[1:]):
        lines.append(f"{name}: {installed_version(name) or 'not installed'}")
    optional = optional_packages()
    if optional:
        versions = [f"{name} {installed_version(name)}" if installed_version(name) else f"{name} -" for name in optional]
        lines.append(f"optional packages (- not installed): {', '.join(versions)}")
    else:
        lines.append("optional packages: unknown (cadence is not installed: pip install -e . lists them here)")
    return "\n".join(f"- {line}" for line in lines)
