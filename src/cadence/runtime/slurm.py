"""SLURM's ``srun`` as a launcher: the process group's variables from SLURM's, when torchrun did not set them.

``srun python train.py`` starts one process a task with SLURM's variables only (``SLURM_PROCID``, ``SLURM_NTASKS``,
``SLURM_LOCALID``, ``SLURM_JOB_NODELIST``, ...); torch and accelerate read torchrun's (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so each such process would train alone. Before the process group
starts (``TrainingArguments``), :func:`apply_slurm_environment` sets torchrun's variables from SLURM's, as
Lightning's ``SLURMEnvironment`` reads them: the rank, the number of tasks, the rank on the node, the first host of
the job's node list as the rendezvous address and a port derived from the job id (the last 4 digits + 15000), unless
``MASTER_ADDR``/``MASTER_PORT`` are set. It says so in one line. torchrun's variables, when present (``srun torchrun
...``), win; ``CADENCE_SLURM=0`` turns the detection off.

A process started inside an allocation of several tasks but not by ``srun`` (``python train.py`` in an ``sbatch``
script or an ``salloc`` shell) would wait for the other tasks forever: it is stopped at once, saying what to do.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, MutableMapping

logger = logging.getLogger(__name__)

SWITCH = "CADENCE_SLURM"  # "0": SLURM's variables are not read
_TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # set by torchrun, accelerate launch, a user: they win


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's host list syntax expanded, in order: ``node[01-03,07]`` -> ``node01 node02 node03 node07``;
    several items (``a,b[1-2]``) and several bracket groups in one name (``rack[1-2]-n[1-2]``) too; zero-padding
    kept.

    Example:
        >>> expand_nodelist("node[01-02,07],gpu3")
        ['node01', 'node02', 'node07', 'gpu3']
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        names = [""]
        for text, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            choices = [text + number for number in _expand_ranges(ranges)] if ranges else [text]
            names = [name + choice for name in names for choice in choices]
        hosts.extend(name for name in names if name)
    return hosts


def _split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item]


def _expand_ranges(ranges: str) -> list[str]:
    """``01-03,07`` -> ``01 02 03 07`` (a range keeps its first number's width)."""
    out = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not high:
            out.append(low)
            continue
        if not (low.isdigit() and high.isdigit()) or int(high) < int(low):
            raise ValueError(f"SLURM node list: {part!r} is not a range of numbers like 01-04")
        out.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return out


def _tasks_on_node(tasks_per_node: str, node: int) -> int | None:
    """The tasks of node ``node`` from SLURM's ``2(x3),1`` format (three nodes of 2, then one of 1)."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return None
        counts += [int(match[1])] * int(match[2] or 1)
    return counts[node] if node < len(counts) else None


def slurm_variables(env: Mapping[str, str]) -> dict[str, str] | None:
    """torchrun's variables for a process ``srun`` started, from SLURM's in ``env``; None when there is nothing to
    set (no SLURM job, one task, torchrun's variables present, or ``CADENCE_SLURM=0``).

    Raises:
        RuntimeError: SLURM says the job has several tasks but this process was not started by ``srun``.
    """
    if env.get(SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if "SLURM_JOB_ID" not in env or any(name in env for name in _TORCHRUN):
        return None
    by_srun = "SLURM_STEP_NUM_TASKS" in env or "SLURM_STEP_ID" in env or "SLURM_STEPID" in env
    tasks = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
    if tasks <= 1:
        return None
    if not by_srun:
        raise RuntimeError(
            f"SLURM job {env['SLURM_JOB_ID']} has {tasks} tasks (SLURM_NTASKS={tasks}), but this process was not "
            "started by srun, so the other tasks would never join it and it would wait for them forever: start the "
            "script with `srun python train.py` (one process a task), or `torchrun` on each node, or set "
            f"{SWITCH}=0 to train in this one process alone")
    node = int(env.get("SLURM_NODEID", 0))
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    hosts = expand_nodelist(nodelist)
    variables = {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": str(tasks), "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
                 "GROUP_RANK": str(node),
                 "MASTER_ADDR": env.get("MASTER_ADDR") or (hosts[0] if hosts else "127.0.0.1"),
                 "MASTER_PORT": env.get("MASTER_PORT") or str(15000 + int(str(env["SLURM_JOB_ID"])[-4:]))}
    local = _tasks_on_node(per_node, node) if per_node else None
    if local is not None:
        variables["LOCAL_WORLD_SIZE"] = str(local)
    return variables


def apply_slurm_environment(env: MutableMapping[str, str] | None = None) -> dict[str, str] | None:
    """Set torchrun's variables from SLURM's in ``env`` (``os.environ``) for a process ``srun`` started
    (:func:`slurm_variables`), and say what was detected in one line; once per process. Returns what was set.

    Example:
        >>> apply_slurm_environment()  # under `srun -N2 --ntasks-per-node 4 python train.py`
        {'RANK': '5', 'WORLD_SIZE': '8', 'LOCAL_RANK': '1', ...}
    """
    env = os.environ if env is None else env
    variables = slurm_variables(env)
    if variables is None:
        return None
    env.update(variables)
    logger.warning("SLURM job %s started by srun: process %s of %s (%s on node %s), rendezvous at %s:%s; set %s=0 "
                   "to turn this detection off", env["SLURM_JOB_ID"], variables["RANK"], variables["WORLD_SIZE"],
                   f"local rank {variables['LOCAL_RANK']}", variables["GROUP_RANK"], variables["MASTER_ADDR"],
                   variables["MASTER_PORT"], SWITCH)
    return variables
