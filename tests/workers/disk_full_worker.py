"""Trains into OUT, runs out of room after checkpoint-2, then frees it and resumes; prints one JSON line.

Usage: python disk_full_worker.py OUT MODE, MODE "disk" (OUT is on a small tmpfs: a filler file takes
the space left) or "fsize" (RLIMIT_FSIZE: the kernel refuses any file over 1 KB, EFBIG).
"""

import json
import os
import resource
import shutil
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
from test_resume import train  # noqa: E402

from cadence import TrainerCallback  # noqa: E402
from cadence.checkpoint.manifest import verify_checkpoint  # noqa: E402

out, mode = sys.argv[1], sys.argv[2]
filler = os.path.join(os.path.dirname(out), "filler")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)


class FillDisk(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        if state.global_step != 2:
            return
        if mode == "disk":
            with open(filler, "wb") as f:  # leave less than a page: the next checkpoint's first file fails
                f.write(b"\0" * max(shutil.disk_usage(out).free - 2048, 0))
        else:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process instead of failing the write
            resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))


report = {}
try:
    train(out, stop=6, save_steps=2, num_train_epochs=1, callbacks=[FillDisk()])
except OSError as e:
    report["error"], report["type"], report["errno"] = str(e), type(e).__name__, e.errno
report["after_failure"] = sorted(os.listdir(out))
verify_checkpoint(os.path.join(out, "checkpoint-2"))  # the older checkpoint is intact
if mode == "disk":
    os.remove(filler)
else:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
trainer, _ = train(out, resume=True, stop=6, save_steps=2, num_train_epochs=1)
report["resumed_to"] = trainer.state.global_step
report["after_resume"] = sorted(os.listdir(out))
print(json.dumps(report))
