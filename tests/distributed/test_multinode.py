"""Past one machine, on this one: two torchrun "nodes" (two launchers over a c10d rendezvous on 127.0.0.1) and a
job started the way SLURM's ``srun`` starts it (SLURM's variables only, set by hand). The decisions that steer
collectives are taken once for the job: a restart that one node's agent counts and the other's does not resumes on
both, from a checkpoint every node holds; ``srun``'s processes form one group. Each run is compared with the same job
under ``torchrun --standalone --nproc_per_node 2`` that never stopped (tests/workers/ddp_resume_worker.py)."""

import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import dist_exit
import pytest
import torch
from dist_exit import assert_finished

from cadence.runtime.slurm import expand_nodelist, slurm_variables
from repo_paths import WORKERS

WORKER = os.path.join(WORKERS, "ddp_resume_worker.py")


def free_port(low=None, high=None) -> int:
    """A port nothing listens on now (in [low, high) when given)."""
    for port in ([0] if low is None else range(low + os.getpid() % 997, high)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    """The weights of the job under torchrun --standalone --nproc_per_node 2, never stopped."""
    out = str(tmp_path_factory.mktemp("unbroken") / "run")
    proc = dist_exit.launch("ddp_resume_worker.py", out, "--save-steps", "2", nproc=2, timeout=300)
    assert_finished(proc, 2)
    return torch.load(os.path.join(out, "final.pt"), weights_only=True)


def assert_same_weights(got_file, expected):
    got = torch.load(got_file, weights_only=True)
    assert set(got) == set(expected) and all(torch.equal(got[k], v) for k, v in expected.items())


def two_nodes(out, *extra, disks=False, timeout=240):
    """The worker on two torchrun "nodes" of one process each (two launchers, c10d rendezvous on 127.0.0.1, one restart
    allowed); with ``disks``, each node's output_dir is its own folder (NODE_DISK). Returns (returncodes, stdout+stderr
    of both launchers, the lines the processes said)."""
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend",
           "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job{port}", "--max-restarts", "1",
           "--monitor-interval", "0.2", WORKER, out, *extra]
    with tempfile.TemporaryDirectory(prefix="said-") as said:
        procs = [subprocess.Popen(cmd, env=dist_exit.worker_env({dist_exit.SAID: said, **(
            {"NODE_DISK": disk} if disks else {})}), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for disk in ("a", "b")]
        try:
            texts = [p.communicate(timeout=timeout)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return [p.returncode for p in procs], "\n".join(texts), dist_exit.said_lines(said)


def check_restarted(codes, text, said, resumed_at):
    assert codes == [0, 0], text[-6000:]
    assert any(line.startswith("PAUSED rank 0") for line in said), said
    starts = {rank: [] for rank in "01"}  # each rank's attempts in order: (restart count, first step)
    for count, rank, step in re.findall(r"ATTEMPT restart (\d+) rank (\d) starts at step (\d+)", "\n".join(said)):
        starts[rank].append((count, step))
    assert [attempts[0] for attempts in starts.values()] == [("0", "0")] * 2, starts
    # the agents' counts differ (the healthy node's restart is a membership change: not counted), yet both resumed
    assert sorted(attempts[1:] for attempts in starts.values()) == [[("0", str(resumed_at))], [("1", str(resumed_at))]], starts
    assert sorted(re.findall(r"FINISHED rank \d", "\n".join(said))) == ["FINISHED rank 0", "FINISHED rank 1"], said


@pytest.mark.slow
def test_a_two_node_restart_whose_agents_disagree_resumes_the_newest_checkpoint_every_node_holds(tmp_path, unbroken):
    """Process 1 is SIGKILLed at step 5 while process 0 is outside any collective: process 1's agent counts a restart,
    process 0's restarts it as a membership change and counts none (TORCHELASTIC_RESTART_COUNT 1 and 0). Each process
    deciding alone took different paths and waited in different collectives until ddp_timeout; now the job agrees that
    it restarted. Each node writes its own disk (save_on_each_node), and at the restart checkpoint-4 is gone from
    process 1's: the main process's newest is not every process's, so both resume checkpoint-2, which both hold, with a
    warning, and end with the unbroken run's weights. (A shared disk takes the same path, with every checkpoint held
    by all: tests/resume/test_ddp_resume.py's torchrun restart.)"""
    out = str(tmp_path / "run")
    codes, text, said = two_nodes(out, "--save-steps", "2", "--kill-rank1", "5", "--pause-rank0", "5",
                                  "--save-on-each-node", "--drop-on-rank1", "checkpoint-4", disks=True)
    assert "DROPPED checkpoint-4 on rank 1" in said, said
    check_restarted(codes, text, said, resumed_at=2)
    assert "checkpoint-4 is not on the disk of every process of the job" in text, text[-6000:]
    final = [os.path.join(out, disk, "final.pt") for disk in ("a", "b")]
    assert_same_weights(next(f for f in final if os.path.exists(f)), unbroken)


@pytest.mark.parametrize("late", [0, 1])
def test_processes_name_their_attempt_alike_over_a_store_holding_earlier_attempts_keys(late):
    """torchrun's store keeps every attempt's keys. Here rank 0 started twice before, rank 1 once (its first attempt
    died before it set anything up) and earlier answers are still there; whichever rank comes late, both name this
    attempt alike, by a number no earlier attempt used (rank 0's third start), so the group's keys are new."""
    import threading
    from datetime import timedelta

    from cadence.runtime.processes import _agreed_attempt

    master = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    master.add("cadence/starts/0", 2)
    master.add("cadence/starts/1", 1)
    for key, value in {"cadence/answer/1/1": b"2", "cadence/ack/1/2": b"1", "cadence/answer/1/2": b"1"}.items():
        master.set(key, value)
    master.delete_key("cadence/answer/1/2")  # the answer the second attempt's rank 1 never came to read
    named = {}

    def start(rank):
        if rank == late:
            time.sleep(0.3)
        store = torch.distributed.TCPStore("127.0.0.1", master.port, is_master=False)
        named[rank] = _agreed_attempt(store, rank, 2, timedelta(seconds=30))

    threads = [threading.Thread(target=start, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert named == {0: 3, 1: 3}


def _choose_on_own_disk(rank, root, port, said):
    """One of 2 processes (gloo over 127.0.0.1) whose output_dir is its own folder ("its disk"): rank 1's lacks
    checkpoint-4. Writes what find_resume_folder gave it for True, then for the relative path checkpoint-4."""
    import json
    from types import SimpleNamespace

    from cadence.checkpoint.resume import find_resume_folder
    from cadence.trainer_callback import TrainerState

    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    disk = os.path.join(root, f"disk{rank}")
    for step in (2, 4) if rank == 0 else (2,):
        os.makedirs(os.path.join(disk, f"checkpoint-{step}"))
        with open(os.path.join(disk, f"checkpoint-{step}", "trainer_state.json"), "w") as f:
            f.write(TrainerState(global_step=step).to_json_string())
    os.chdir(disk)  # the relative checkpoint-4 is on rank 0's disk only
    args, got = SimpleNamespace(should_save=False, output_dir=disk), {}
    got["newest"] = str(find_resume_folder(True, args, torch.distributed.barrier))
    try:
        find_resume_folder("checkpoint-4", args, torch.distributed.barrier)
    except ValueError as error:
        got["named"] = str(error)
    # both disks hold checkpoint-2 and checkpoint-4, rank 1's copy of checkpoint-4 damaged (its state is not JSON)
    disk = os.path.join(root, f"damaged{rank}")
    for step in (2, 4):
        os.makedirs(os.path.join(disk, f"checkpoint-{step}"))
        with open(os.path.join(disk, f"checkpoint-{step}", "trainer_state.json"), "w") as f:
            f.write("{" if (rank, step) == (1, 4) else TrainerState(global_step=step).to_json_string())
    os.chdir(disk)
    args = SimpleNamespace(should_save=False, output_dir=disk)
    got["intact"] = str(find_resume_folder(True, args, torch.distributed.barrier))
    try:
        find_resume_folder("checkpoint-4", args, torch.distributed.barrier)
    except ValueError as error:
        got["damaged"] = str(error)
    torch.distributed.destroy_process_group()
    with open(os.path.join(said, f"{rank}.json"), "w") as f:
        json.dump(got, f)


@pytest.mark.slow
def test_every_process_resumes_the_newest_checkpoint_all_hold_intact_and_a_path_one_lacks_stops_all(tmp_path):
    """resume_from_checkpoint=True on two processes whose disks differ: both get checkpoint-2 (rank 1 lacks the main
    process's newest, checkpoint-4), each in its own output_dir; a path that one process lacks is an error on both,
    naming that process (each deciding alone, rank 0 would load checkpoint-4 while rank 1 raised or loaded another).
    The same where rank 1 holds checkpoint-4 damaged: True gives both checkpoint-2, and the path is an error on both
    naming process 1's copy (had only the main process checked its own, both would take checkpoint-4 and rank 1
    would fail alone while loading it, rank 0 waiting for it in the first collective)."""
    import json

    import torch.multiprocessing as mp

    mp.start_processes(_choose_on_own_disk, args=(str(tmp_path), free_port(), str(tmp_path)), nprocs=2,
                       start_method="spawn")
    got = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert [g["newest"] for g in got] == [str(tmp_path / f"disk{rank}" / "checkpoint-2") for rank in (0, 1)]
    for g in got:
        assert "resume_from_checkpoint='checkpoint-4' is not a complete checkpoint on the disk of process 1" in g["named"]
    assert [g["intact"] for g in got] == [str(tmp_path / f"damaged{rank}" / "checkpoint-2") for rank in (0, 1)]
    for g in got:
        assert "checkpoint-4' is damaged on the disk of process 1" in g["damaged"], g
        assert "trainer_state.json" in g["damaged"], g


# ------------------------------------------------------------------ SLURM's srun


@pytest.mark.parametrize("nodelist, hosts", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("gpu7", ["gpu7"]),
    ("a[8-10],b,c[1,3]", ["a8", "a9", "a10", "b", "c1", "c3"]),
    ("rack[1-2]-n[09-10]", ["rack1-n09", "rack1-n10", "rack2-n09", "rack2-n10"]),
    ("node[001-002]", ["node001", "node002"]),
])
def test_slurm_node_lists_expand_as_slurm_writes_them(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_a_bad_node_range_is_named():
    with pytest.raises(ValueError, match="'9-3' is not a range"):
        expand_nodelist("node[9-3]")


SRUN = {"SLURM_JOB_ID": "123456", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}


def test_srun_variables_become_torchruns():
    assert slurm_variables(SRUN) == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "GROUP_RANK": "1",
                                     "MASTER_ADDR": "gpu07", "MASTER_PORT": str(15000 + 3456),
                                     "LOCAL_WORLD_SIZE": "4"}
    # a user's MASTER_ADDR/MASTER_PORT are kept; torchrun's variables win; the switch turns it off; one task: nothing
    assert slurm_variables({**SRUN, "MASTER_PORT": "29500"})["MASTER_PORT"] == "29500"
    assert slurm_variables({**SRUN, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}) is None
    assert slurm_variables({**SRUN, "CADENCE_SLURM": "0"}) is None
    assert slurm_variables({**SRUN, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1"}) is None
    assert slurm_variables({"PATH": "/bin"}) is None


def test_a_script_run_inside_an_allocation_but_not_by_srun_stops_at_once(tmp_path):
    """python train.py in an sbatch script of 2 tasks: SLURM says 2, one process runs; it would wait for the other
    forever. It stops before anything starts, saying what to do."""
    env = {k: v for k, v in SRUN.items() if not k.startswith("SLURM_STEP")}
    env = {**env, "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "from cadence import TrainingArguments; TrainingArguments('out')"],
                          env=dist_exit.worker_env(env), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and time.monotonic() - start < 60
    assert "has 2 tasks (SLURM_NTASKS=2), but this process was not started by srun" in proc.stderr, proc.stderr[-3000:]
    assert "srun python train.py" in proc.stderr and "CADENCE_SLURM=0" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_two_processes_started_as_srun_starts_them_train_as_torchrun(tmp_path, unbroken):
    """Two plain python processes with SLURM's variables only (what srun sets; the node list's first host is this
    machine, the port comes from the job id): one process group, and the unbroken torchrun run's weights."""
    port = free_port(15000, 25000)
    job = f"9{port - 15000:04d}"
    out = str(tmp_path / "run")
    base = {"SLURM_JOB_ID": job, "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "0",
            "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2"}
    with tempfile.TemporaryDirectory(prefix="said-") as said:
        procs = [subprocess.Popen([sys.executable, WORKER, out, "--save-steps", "2"], env=dist_exit.worker_env(
            {**base, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), dist_exit.SAID: said}), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank in (0, 1)]
        try:
            texts = [p.communicate(timeout=240)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        lines = dist_exit.said_lines(said)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(texts)[-6000:]
    assert f"SLURM job {job} started by srun: process 1 of 2 (local rank 1 on node 0), rendezvous at localhost:{port}" \
        in texts[1], texts[1][-3000:]
    assert sorted(re.findall(r"FINISHED rank \d", "\n".join(lines))) == ["FINISHED rank 0", "FINISHED rank 1"], lines
    assert_same_weights(os.path.join(out, "final.pt"), unbroken)


def test_a_job_slurm_requeued_resumes_its_own_checkpoint_by_itself(tmp_path, monkeypatch):
    """sbatch --requeue: SLURM starts the job again with its id and SLURM_RESTART_COUNT=1. Not told to resume, it
    continues its own newest checkpoint and ends with the unbroken run's weights; another job's checkpoint there is only
    warned about (a new run)."""
    from test_resume import train

    from cadence import TrainerCallback

    class Start(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            starts.append(state.global_step)

    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    full, _ = train(tmp_path / "full")
    out, starts = tmp_path / "run", []
    train(out, stop=4, save_steps=2, callbacks=[Start()])
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    requeued, _ = train(out, save_steps=2, callbacks=[Start()])
    assert starts == [0, 4]
    assert all(torch.equal(a, b) for a, b in zip(requeued.model.state_dict().values(), full.model.state_dict().values()))
    monkeypatch.setenv("SLURM_JOB_ID", "4243")  # another job, requeued: the checkpoints there are not its own
    train(tmp_path / "run", stop=2, save_steps=2, callbacks=[Start()])
    assert starts == [0, 4, 0]
