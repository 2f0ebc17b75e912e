"""The start-up hook's switch: ``CADENCE_PATCH_TRANSFORMERS`` with one of the usual false words (``0``, ``false``,
``no``, ``off``, empty; any case, spaces trimmed) leaves a process alone; set, with cadence not importable, it says so
in one line (no traceback) and the process goes on; set in a process where ``transformers.trainer`` was imported
before the hook ran, that module is patched at once.

Each case is a fresh interpreter started with ``-S`` that runs this checkout's ``cadence_patch.pth`` through
``site.addsitedir`` (as site-packages' .pth files run at start-up), with the test venv's packages on PYTHONPATH (whose
own .pth files do not run that way), so the hook tested is the one in ``src/``, not the installed copy.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
from repo_paths import REPO

ROOT = REPO
MARK = "CADENCE_PATCH_TRANSFORMERS"


@pytest.fixture(scope="module")
def hook(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hook")
    shutil.copy(os.path.join(ROOT, "src", "cadence_patch.pth"), folder)
    return str(folder)


def start(hook, code, value, path):
    env = {k: v for k, v in os.environ.items() if k not in (MARK, "PYTHONPATH")}
    env.update({"PYTHONPATH": os.pathsep.join([*path, sysconfig.get_paths()["purelib"]]), "OMP_NUM_THREADS": "1",
                "HF_HUB_OFFLINE": "1"})
    if value is not None:
        env[MARK] = value
    prelude = code.pop(0) if isinstance(code, list) else ""
    script = f"{prelude}\nimport site, sys\nsite.addsitedir({hook!r})\n{code if isinstance(code, str) else code[0]}"
    return subprocess.run([sys.executable, "-S", "-c", script], env=env, capture_output=True, text=True, timeout=300)


FINDER = "import json; print(json.dumps([type(f).__name__ for f in sys.meta_path if 'Patch' in type(f).__name__]))"


@pytest.mark.parametrize("value", [None, "", "0", "00", " 0 ", "false", "False", "FALSE", "no", "No", "off", " off "])
def test_the_usual_false_words_leave_the_process_alone(hook, value):
    proc = start(hook, FINDER, value, [os.path.join(ROOT, "src")])
    assert proc.returncode == 0 and json.loads(proc.stdout) == [], proc.stdout + proc.stderr


@pytest.mark.parametrize("value", ["1", "true", "yes", "on"])
def test_a_set_mark_installs_the_patch(hook, value):
    proc = start(hook, FINDER, value, [os.path.join(ROOT, "src")])
    assert proc.returncode == 0 and json.loads(proc.stdout) == ["_PatchOnImport"], proc.stdout + proc.stderr


@pytest.mark.parametrize("broken", ["moved", "import error"])
def test_cadence_not_importable_is_one_line_not_a_traceback(hook, tmp_path, broken):
    """An editable install whose folder moved (no cadence at all), or an error raised inside the package."""
    if broken == "import error":
        (tmp_path / "cadence").mkdir()
        (tmp_path / "cadence" / "__init__.py").write_text("raise ImportError('a broken cadence')\n")
    proc = start(hook, "print('ran')", "1", [str(tmp_path)])
    assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"cadence: {MARK} is set but the start-up hook cannot import cadence (")
    assert ("No module named 'cadence'" if broken == "moved" else "ImportError: a broken cadence") in lines[0]
    assert f"Set {MARK}=0 to switch the hook off" in lines[0]


@pytest.mark.slow  # a fresh process importing transformers' trainer: over 20 s on the shared CPUs
def test_a_trainer_module_imported_before_the_hook_is_patched_at_once(hook):
    """A sitecustomize (or anything run before site-packages' .pth files) that imported transformers.trainer: the
    import finder would never see it, so the hook patches it on the spot."""
    code = ["import transformers.trainer",
            "import json, cadence, transformers\nprint(json.dumps([transformers.Trainer is cadence.Trainer, "
            "transformers.trainer.Trainer is cadence.Trainer, transformers.TrainingArguments is cadence.TrainingArguments]))"]
    proc = start(hook, code, "1", [os.path.join(ROOT, "src")])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [True, True, True]
