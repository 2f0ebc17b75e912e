"""A process that dies, or stops answering, mid-run: the survivor stops with an error naming its rank and
the step, within ddp_timeout, instead of hanging. Both ranks are started directly (RANK/WORLD_SIZE set as a
launcher sets them, but with no torchrun agent that would kill the survivor for us, as srun or mpirun)."""

import os
import socket
import subprocess
import sys
import time

import pytest
from repo_paths import TESTS, WORKERS

HERE = TESTS


def launch_pair(out, step, timeout, mode):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = os.path.join(os.path.dirname(HERE), "src")
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([HERE, src]), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, os.path.join(WORKERS, "dead_rank_worker.py"), str(out), str(step),
                                       str(timeout), mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    return procs


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["die", "hang"])
def test_survivor_stops_with_named_error(mode, tmp_path):
    timeout = 20
    procs = launch_pair(tmp_path, 3, timeout, mode)
    start = time.time()
    try:
        _, err = procs[0].communicate(timeout=240)  # the survivor
    finally:
        for p in procs:  # the silent rank 1 of "hang" is ours to end
            p.kill() if p.poll() is None else None
            p.communicate()
    elapsed = time.time() - start
    assert procs[0].returncode not in (0, None), err[-2000:]
    assert "process 0 of 2 stopped at step 3" in err, err[-2000:]
    assert "ddp_timeout=20s" in err
    if mode == "die":  # the transport notices the closed connection at once
        assert procs[1].returncode == 17
        # gloo words a dead peer as "closed" or "reset" depending on where its read was when the socket went
        assert "Connection closed by peer" in err or "Connection reset by peer" in err
    # within ddp_timeout (plus start-up on this loaded machine): never an open-ended hang
    assert elapsed < 120
