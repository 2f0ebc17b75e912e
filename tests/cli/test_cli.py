"""The ``cadence`` command's habits, run as a user runs it (``python -m cadence`` and the installed ``cadence``
script, in fresh processes): ``--version`` names torch and transformers; ``cadence env``; ``cadence run --help`` says
what it does with examples; a missing script or module is one line (exit 2), found before transformers is patched or
any package imported; flags are never abbreviated and take both spellings; a bad value prints the short usage and the
one error; ``cadence train --help`` starts with examples, is grouped and comes without transformers; the demo logs at
least 5 times, prints no escapes into a pipe and names ``cadence plot``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cadence.version import __version__
from repo_paths import REPO

ROOT = Path(REPO)


def cadence(*args, cwd=None, script=False):
    """``python -m cadence ARGS`` (or the console script next to this Python) on this checkout's ``src``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [str(Path(sys.executable).parent / "cadence")] if script else [sys.executable, "-m", "cadence"]
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def usage_error(proc, command):
    """argparse's shape: the usage (a few lines), then ``cadence COMMAND: error: ...``; exit 2, no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0].startswith("usage: cadence") and len(lines) <= 5, proc.stderr
    assert lines[-1].startswith(f"cadence {command}: error: "), proc.stderr
    return lines[-1]


def versions_line():
    from importlib import metadata

    return f"cadence {__version__} (torch {metadata.version('torch')}, transformers {metadata.version('transformers')})"


def test_version_names_torch_and_transformers():
    proc = cadence("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == versions_line(), proc.stdout + proc.stderr


def test_env_prints_what_a_bug_report_needs():
    """``cadence env``: one ``- name: value`` line each, the versions as installed, the devices, where cadence was
    imported from and the start-up hook's state."""
    from importlib import metadata

    import torch

    proc = cadence("env")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    facts = dict(line[2:].split(": ", 1) for line in proc.stdout.strip().splitlines())
    assert facts["cadence"].startswith(f"{__version__}, imported from {ROOT / 'src' / 'cadence'}")
    assert facts["torch"].startswith(torch.__version__) and facts["devices"].startswith("cpu (")
    for name in ("transformers", "accelerate", "safetensors", "numpy", "tqdm"):
        assert facts[name] == metadata.version(name)
    assert "cadence_patch.pth" in facts["start-up hook"] and "CADENCE_PATCH_TRANSFORMERS=" in facts["start-up hook"]
    assert set(facts) >= {"python", "platform"} and any(key.startswith("optional packages") for key in facts)


@pytest.mark.skipif(not (Path(sys.executable).parent / "cadence").exists(), reason="cadence is not installed here")
def test_installed_console_script_version_and_run_help():
    proc = cadence("--version", script=True)
    assert proc.returncode == 0 and proc.stdout.strip() == versions_line()
    proc = cadence("run", "--help", script=True)
    assert proc.returncode == 0 and "examples:" in proc.stdout


def test_run_help_says_what_it_does_with_examples():
    proc = cadence("run", "--help")
    assert proc.returncode == 0 and proc.stderr == ""
    text = proc.stdout
    assert text.startswith("usage: cadence run SCRIPT [ARGS...]")
    assert "patch_transformers()" in text and "TRL" in text
    assert "cadence run -m trl.scripts.sft" in text and "torchrun --nproc_per_node 2 -m cadence run" in text


def test_run_without_a_script_is_a_usage_error():
    assert "name a script" in usage_error(cadence("run"), "run")
    assert "-m needs a module name" in usage_error(cadence("run", "-m"), "run")


def test_run_missing_module_is_one_line_before_anything_is_imported(tmp_path):
    """A package on the path whose ``__init__`` leaves a mark: asking for a missing module inside it must not import
    it (an import before the patch would keep transformers' classes in a library) and must name the module."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("open('imported', 'w').close()\n")
    (package / "job.py").write_text("import sys\nopen('ran', 'w').write(' '.join(sys.argv[1:]))\n")
    line = usage_error(cadence("run", "-m", "nosuch_module_h41"), "run")
    assert "no module named 'nosuch_module_h41'" in line
    line = usage_error(cadence("run", "-m", "pkg.nosuch", cwd=tmp_path), "run")
    assert "no module named 'pkg.nosuch'" in line and not (tmp_path / "imported").exists()
    assert "package without a __main__" in usage_error(cadence("run", "-m", "pkg", cwd=tmp_path), "run")
    proc = cadence("run", "-m", "pkg.job", "--flag", "1", cwd=tmp_path)  # found: it runs, with its arguments
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "ran").read_text() == "--flag 1" and (tmp_path / "imported").exists()


def test_run_missing_script_is_one_line_without_third_party_warnings(tmp_path):
    proc = cadence("run", "nosuch.py", "--flag", cwd=tmp_path)
    line = usage_error(proc, "run")
    assert "'nosuch.py' does not exist" in line
    assert len(proc.stderr.strip().splitlines()) == 3  # the usage's two lines and the error: no library warned first


@pytest.mark.parametrize("flag", ["--learning_rat", "--learning-rat", "--max_step"])
def test_train_refuses_abbreviated_flags(flag, tmp_path):
    """argparse takes a prefix of one flag for that flag; ``--learning_rat 1e-3`` would silently set the
    learning rate. Refused before any file or model is read, naming the flag meant."""
    proc = cadence("train", "--model", "nothing", "--train_file", "nothing.txt", flag, "3", cwd=tmp_path)
    line = usage_error(proc, "train")
    assert f"unrecognized arguments: {flag} 3" in line and "did you mean --" in line


def test_train_bad_choice_prints_the_short_usage_and_the_error(tmp_path):
    proc = cadence("train", "--model", "nothing", "--train_file", "nothing.txt", "--task", "nosuch", cwd=tmp_path)
    line = usage_error(proc, "train")
    assert "argument --task: invalid choice: 'nosuch'" in line and "causal-lm" in line
    proc = cadence("train", "--model", "nothing", "--train_file", "nothing.txt", "--lr_scheduler_type", "cosin",
                   cwd=tmp_path)
    assert "argument --lr_scheduler_type/--lr-scheduler-type: invalid choice: 'cosin'" in usage_error(proc, "train")


def test_train_help_starts_with_examples_is_grouped_and_as_fast_as_importing_torch():
    """``cadence train --help`` starts with examples, then lists its flags under the headings of TrainingArguments' documentation, without
    importing transformers (2.5 s before), so it comes within 0.3 s of ``python -c "import torch"``: the fastest of
    two runs each, interleaved, with compiled bytecode as an installed cadence has it. The processes' CPU time is
    compared (wall time on a shared machine mostly measures the other jobs)."""
    import resource

    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    show = "import sys; from cadence.cli import main; main(['train', '--help']); print('transformers' in sys.modules)"
    runs = {"torch": [], "help": []}
    for _ in range(2):
        for name, code in (("torch", "import torch"), ("help", show)):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            runs[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert text.splitlines()[-1] == "False"  # transformers was not imported
    head = text.splitlines()[:12]  # it starts with the usage and examples
    assert head[0].startswith("usage: cadence train --model MODEL --train_file FILE")
    assert "examples:" in head and any(line.strip().startswith("cadence train --model ./") for line in head)
    for heading in ("cadence train:", "Output:", "Optimizer:", "Precision:", "Evaluation:", "Checkpoints:", "Logging:"):
        assert f"\n{heading}\n" in text, heading
    assert "\nother:\n" not in text  # every field found its group
    assert "'none' (the default)" not in text and "(default: jsonl)" in text  # report_to's help says one default
    assert min(runs["help"]) - min(runs["torch"]) < 0.3, runs


def test_other_commands_refuse_abbreviated_flags(tmp_path):
    proc = cadence("demo", "--max", "3", "--output-dir", str(tmp_path / "demo"))
    assert proc.returncode == 2 and "unrecognized arguments: --max 3" in proc.stderr
    assert not (tmp_path / "demo").exists()
    proc = cadence("plot", str(tmp_path), "--ou", "x.png")
    assert proc.returncode == 2 and "unrecognized arguments: --ou x.png" in proc.stderr


def test_demo_logs_five_times_without_escapes_and_names_cadence_plot(tmp_path):
    """A 10-step demo (``--max_steps`` and ``--output-dir``: both spellings are taken) logs its loss at least 5
    times, evaluates while it trains, prints no terminal escapes into a pipe, and ends naming ``cadence plot``."""
    import ast

    proc = cadence("demo", "--max_steps", "10", "--output-dir", str(tmp_path / "demo"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = [ast.literal_eval(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    losses = [float(log["loss"]) for log in logs if "loss" in log]
    assert len(losses) >= 5 and len([log for log in logs if "eval_loss" in log]) >= 3, proc.stdout
    assert "\x1b" not in proc.stdout + proc.stderr
    summary = proc.stdout.strip().splitlines()
    assert f"train loss  {losses[0]:.3f} -> {losses[-1]:.3f}" in proc.stdout and losses[0] != losses[-1]
    assert summary[-1].split()[:4] == ["curves", "cadence", "plot", str(tmp_path / "demo")]


def test_plot_of_a_missing_folder_names_it_before_importing_anything(tmp_path):
    show = ("import sys; from cadence.cli import main; code = main(['plot', 'nosuch']); "
            "print(code, 'torch' in sys.modules, 'matplotlib' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", show], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.stdout.split() == ["2", "False", "False"], proc.stdout + proc.stderr
    assert proc.stderr.strip() == "cadence plot: error: nosuch: no such folder or file; pass a run's output_dir"
