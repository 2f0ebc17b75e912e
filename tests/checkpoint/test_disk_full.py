"""A full disk fails the save with a message naming the checkpoint, the file and the space; nothing half-written.

Two ways to run out of room, each real (the kernel fails the write, nothing is patched): a 2 MB
tmpfs mounted in a user namespace (``unshare -rm``, where the machine allows it) filled up after
checkpoint-2, and RLIMIT_FSIZE, which makes the kernel refuse any file over 1 KB (EFBIG) and
works everywhere. Where user namespaces are not allowed the "disk" case uses the file-size limit too.
"""

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
from repo_paths import WORKERS

WORKER = os.path.join(WORKERS, "disk_full_worker.py")


def can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.parametrize("mode", ["disk", "fsize"])
def test_a_failed_save_names_folder_file_and_space_and_keeps_older_checkpoints(tmp_path, mode):
    mount = tmp_path / "small"
    mount.mkdir()
    out = str(mount / "run")
    if mode == "disk" and can_mount_tmpfs():
        command = ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=2m tmpfs "$1" && exec "$0" "$2" "$3" disk',
                   sys.executable, str(mount), WORKER, out]
        expected_errno = errno.ENOSPC
    else:
        command, mode, expected_errno = [sys.executable, WORKER, out, "fsize"], "fsize", None
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    message = report["error"]
    assert report["type"] == "OSError"
    assert f"could not write checkpoint {out}/checkpoint-4" in message
    assert "writing rng_state.pth failed" in message  # the first file of a checkpoint (every process writes its own)
    assert "a checkpoint here takes about" in message and "(the size of checkpoint-2)" in message and "is free there" in message
    assert "save_total_limit=N needs room for N+1 checkpoints" in message
    if expected_errno is not None:
        assert report["errno"] == expected_errno and "No space left on device" in message
    # nothing half-written: no checkpoint-4, no staging folder; checkpoint-2 verified intact by the worker
    assert report["after_failure"] == ["checkpoint-2"]
    assert report["resumed_to"] == 6 and report["after_resume"] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
