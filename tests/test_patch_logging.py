"""Logging under ``patch_transformers()``: cadence's Trainer logs where transformers' Trainer logs.

transformers' library root logger (``transformers``) does not pass records on to Python's root logger, and users and
transformers' own tests read the Trainer's messages through it: ``transformers.logging.set_verbosity_*()`` sets what
shows, ``CaptureLogger(transformers.logging.get_logger())`` captures. While patched, cadence's loggers are its
children, so both apply to cadence's messages; ``unpatch_transformers()`` puts them back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import dist_exit

# One process: the same runs on cadence (patched), then, after unpatch_transformers(), on transformers' own Trainer.
CODE = textwrap.dedent("""
    import json, logging, sys, torch
    import cadence.patch

    ours = logging.getLogger("cadence")
    ours.setLevel(logging.CRITICAL)  # the application's own setting before the patch: it must come back
    before = [ours.parent.name, ours.level]
    cadence.patch.patch_transformers()
    import transformers
    from transformers.testing_utils import CaptureLogger

    class Line(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x, labels):
            return {"loss": ((self.a * x - labels) ** 2).mean()}

    data = [{"x": torch.tensor([float(i)]), "labels": torch.tensor([2.0 * i])} for i in range(4)]
    # (verbosity before the Trainer is built, its log_level, verbosity set between building it and train())
    CASES = [("error", "passive", None), ("info", "passive", None), ("info", "error", None), ("error", "passive", "info")]

    def runs(out):
        seen, classes = [], set()
        for i, (verbosity, log_level, later) in enumerate(CASES):
            getattr(transformers.logging, "set_verbosity_" + verbosity)()
            with CaptureLogger(transformers.logging.get_logger()) as cl:
                args = transformers.TrainingArguments(f"{out}/{i}", max_steps=1, per_device_train_batch_size=2,
                                                      report_to="none", save_strategy="no", use_cpu=True,
                                                      disable_tqdm=True, log_level=log_level)
                trainer = transformers.Trainer(Line(), args, train_dataset=data)
                if later:
                    getattr(transformers.logging, "set_verbosity_" + later)()
                trainer.train()
            seen.append("Running training" in cl.out)
            classes.add(type(trainer).__module__)
        return seen, sorted(classes)

    patched = runs(sys.argv[1] + "/cadence")
    cadence.patch.unpatch_transformers()
    after = [ours.parent.name, ours.level]
    reference = runs(sys.argv[1] + "/transformers")
    print(json.dumps({"patched": patched, "reference": reference, "before": before, "after": after}))
""")


def test_patched_trainer_logs_through_transformers_root_logger(tmp_path):
    """Captured by ``CaptureLogger(transformers.logging.get_logger())`` and following ``set_verbosity_*()`` (before
    the Trainer is built, through its ``log_level``, and after it is built) exactly as transformers' own Trainer's
    messages are, in the same process; after ``unpatch_transformers()`` the ``cadence`` logger has its parent and level
    from before the patch."""
    proc = subprocess.run([sys.executable, "-c", CODE, str(tmp_path)], cwd=tmp_path, env=dist_exit.worker_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["patched"][1] == ["cadence.trainer"] and seen["reference"][1] == ["transformers.trainer"], seen
    assert seen["reference"][0] == [False, True, False, True], seen  # transformers' own behaviour
    assert seen["patched"][0] == seen["reference"][0], seen
    assert seen["after"] == seen["before"] == ["root", 50], seen
