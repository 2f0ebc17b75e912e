"""cadence underneath wherever the run goes: the start-up hook (``cadence_patch.pth``, installed with the package)
patches every Python process started with ``CADENCE_PATCH_TRANSFORMERS`` set, which ``cadence run`` and
``patch_transformers()`` set; ``cadence run`` as its console script runs it; transformers' own Trainer built in a
process that asked for cadence warns; 4.x's ``tokenizer=``.

The hook only exists in an installed cadence, so these tests install this checkout into a throwaway venv (``pip
install -e`` as the Makefile does; the running interpreter's packages reached through a plain path line, whose
folder's .pth files Python does not run) and launch its ``python`` and ``cadence`` console script, as a user would.
Every reference run on transformers proves it was (its class, or no cadence file in its checkpoint).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import warnings
from types import SimpleNamespace

import pytest
import torch

import dist_exit
from repo_paths import TESTS, WORKERS

HERE = TESTS
ROOT = os.path.dirname(HERE)
PTH = "cadence_patch.pth"
MARK = "CADENCE_PATCH_TRANSFORMERS"
TRL = os.path.join(os.path.dirname(sys.executable), "trl")  # `$(which trl)` of the interpreter running the tests
KEEP = {"src", "setup.py", "pyproject.toml", "README.md", "MANIFEST.in"}  # what a wheel is built from
TOL = 1e-5  # both sides do the same float32 arithmetic in the same order (test_trl.py: 0.0 measured); bugs move 1e-3+


def make_venv(folder, install: str | None = "editable") -> str:
    """A venv in ``folder`` with this checkout installed (``"editable"``: ``pip install -e``; ``"wheel"``: ``pip
    install .``; None: not installed); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = os.path.join(str(folder), "bin", "python")
    with open(os.path.join(purelib(python), "zz_outer_site_packages.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    if install:
        source = ROOT
        if install == "wheel":  # built from a copy: a wheel build leaves build/ behind in the tree it builds
            source = os.path.join(str(folder), "source")
            shutil.copytree(ROOT, source, ignore=lambda d, names: [n for n in names if n not in KEEP] if d == ROOT
                            else [n for n in names if n == "__pycache__" or n.endswith(".egg-info")])
        proc = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
                               "--no-build-isolation", *(["-e"] if install == "editable" else []), source],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return python


def purelib(python: str) -> str:
    return subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()


def clean_env(**extra) -> dict:
    """A user's shell: no PYTHONPATH, no mark, the test interpreter's console scripts (trl, accelerate) on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", MARK)}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PATH=os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")]), **extra)
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    folder = tmp_path_factory.mktemp("venv") / "v"
    python = make_venv(folder)
    return SimpleNamespace(python=python, cadence=os.path.join(str(folder), "bin", "cadence"), site=purelib(python))


def run(cmd, timeout=600, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("env", clean_env())
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    return proc


# ---------------------------------------------------------------- the hook: shipped with the package, free when unset


def test_editable_and_wheel_installs_ship_the_hook(venv, tmp_path):
    """``pip install -e .`` and ``pip install .`` both put cadence_patch.pth at the root of site-packages, listed in
    RECORD (so pip uninstall removes it): shipped in the wheel, never written at run time."""
    shipped = open(os.path.join(ROOT, "src", PTH)).read()
    for site in (venv.site, purelib(make_venv(tmp_path / "wheel", install="wheel"))):
        assert open(os.path.join(site, PTH)).read() == shipped
        (record,) = glob.glob(os.path.join(site, "cadence-*.dist-info", "RECORD"))
        assert any(line.startswith(f"{PTH},") for line in open(record)), site
    assert shipped.count("\n") == 1 and shipped.startswith("import ")  # one line: site runs it with exec


def test_the_hook_does_nothing_unless_asked(venv):
    """Unset (or "0"), a Python start-up imports nothing of cadence and adds no finder; set, it adds the finder and
    still imports nothing of transformers (that waits for a trainer module's import)."""
    probe = ("import sys, json; print(json.dumps({'modules': sorted(m for m in sys.modules if m.split('.')[0] in "
             "('cadence', 'transformers', 'torch')), 'finders': [type(f).__name__ for f in sys.meta_path]}))")
    seen = {value: json.loads(run([venv.python, "-c", probe], env=clean_env(**({MARK: value} if value else {})))
                              .stdout) for value in (None, "0", "1")}
    for value in (None, "0"):
        assert seen[value]["modules"] == [] and "_PatchOnImport" not in seen[value]["finders"], seen[value]
    assert "_PatchOnImport" in seen["1"]["finders"]
    assert not [m for m in seen["1"]["modules"] if not m.startswith("cadence")], seen["1"]


@pytest.mark.slow  # fresh processes importing transformers and trl: over 20 s on the shared CPUs
def test_a_marked_process_patches_each_trainer_module_as_it_loads(venv):
    """No cadence in the script: `import transformers; class X(transformers.Trainer)` and TRL's classes are built on
    cadence, the patched modules keep their own loaders, and the mark set by patch_transformers() is what did it."""
    code = textwrap.dedent("""
        import importlib.machinery, json, transformers
        class X(transformers.Trainer):
            pass
        from transformers import TrainingArguments
        import trl, cadence, transformers.trainer
        print(json.dumps({"x": issubclass(X, cadence.Trainer), "args": TrainingArguments is cadence.TrainingArguments,
                          "sft": issubclass(trl.SFTTrainer, cadence.Trainer) and issubclass(trl.SFTConfig,
                                                                                         cadence.TrainingArguments),
                          "loader": isinstance(transformers.trainer.__loader__, importlib.machinery.SourceFileLoader)}))
    """)
    seen = json.loads(run([venv.python, "-c", code], env=clean_env(**{MARK: "1"})).stdout.splitlines()[-1])
    assert seen == {"x": True, "args": True, "sft": True, "loader": True}, seen
    unmarked = run([venv.python, "-c", code.replace("import importlib", "import sys; assert 'cadence' not in "
                                                    "sys.modules; import importlib")]).stdout.splitlines()[-1]
    assert json.loads(unmarked)["x"] is False  # the same script unmarked: transformers' Trainer


@pytest.mark.slow  # a fresh process importing transformers and training twice
def test_transformers_trainer_built_in_a_marked_process_warns_once(tmp_path):
    """A process asked to run on cadence that builds transformers' own Trainer anyway (its class kept from before the
    patch where no module attribute shows it) says so once, naming the class and why, before anything else can go
    wrong; patch_transformers() set the mark for the children."""
    code = textwrap.dedent("""
        import json, os, sys, warnings
        import transformers.trainer, transformers.training_args
        kept = {"trainer": transformers.trainer.Trainer, "args": transformers.training_args.TrainingArguments}
        import cadence, tiny
        cadence.patch_transformers()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(2):
                args = kept["args"](sys.argv[1], max_steps=1, report_to=[], use_cpu=True, disable_tqdm=True)
                try:  # its module's names now point at cadence's, so transformers' class may fail past the warning
                    kept["trainer"](tiny.RegressionModel(), args, train_dataset=tiny.RegressionDataset(8))
                except Exception:
                    pass
        print(json.dumps({"warnings": [str(w.message) for w in seen if "cadence:" in str(w.message)],
                          "mark": os.environ.get("CADENCE_PATCH_TRANSFORMERS")}))
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=dist_exit.worker_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["mark"] == "1"
    assert len(seen["warnings"]) == 1, seen
    assert "transformers.trainer.Trainer" in seen["warnings"][0]
    assert "before cadence.patch_transformers() ran" in seen["warnings"][0]


# ---------------------------------------------------------------- the patch's check and `cadence run` as users start it


@pytest.mark.slow  # a fresh process importing transformers
def test_patch_names_a_module_that_subclasses_through_the_transformers_module(tmp_path):
    """`import transformers; class X(transformers.Trainer)` holds no Trainer name of its own, only its subclass: the
    error still names the module."""
    (tmp_path / "early_lib.py").write_text("import transformers\n\n\nclass EarlyTrainer(transformers.Trainer):\n"
                                           "    pass\n")
    code = "import early_lib, cadence\ntry:\n    cadence.patch_transformers()\nexcept RuntimeError as e:\n    print(e)\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=dist_exit.worker_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "after early_lib had been imported" in proc.stdout, proc.stdout[-2000:]


RECORDER = """
import json, sys, transformers, cadence
json.dump({"argv": sys.argv, "name": __name__, "path0": sys.path[0], "patched": transformers.Trainer is cadence.Trainer,
           "helper": __import__("helper").WHERE}, open(sys.argv[-1], "w"))
"""


@pytest.mark.slow  # cadence run imports transformers
def test_console_script_run_m_finds_the_module_in_the_working_folder(venv, tmp_path):
    """The `cadence` console script's sys.path[0] is its bin folder: `cadence run -m mod`, run from mod's folder,
    puts the working folder first as `python -m mod` does (`python -m cadence run` would hide its absence)."""
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "mod.py").write_text(RECORDER)
    (folder / "helper.py").write_text("WHERE = 'proj'\n")
    out = tmp_path / "seen.json"
    run([venv.cadence, "run", "-m", "mod", "--flag", out], cwd=folder)
    seen = json.loads(out.read_text())
    assert os.path.realpath(seen["path0"]) == os.path.realpath(folder)
    assert seen["argv"] == [str(folder / "mod.py"), "--flag", str(out)] and seen["name"] == "__main__"
    assert seen["patched"] and seen["helper"] == "proj"


@pytest.mark.slow  # cadence run imports transformers
def test_run_script_from_another_folder_imports_the_module_beside_it(venv, tmp_path):
    """`cadence run proj/train.py` from proj's parent: sys.path[0] is proj (as `python proj/train.py`), so the
    script's `import helper` finds proj/helper.py, not the working folder's helper.py."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text(RECORDER)
    (tmp_path / "proj" / "helper.py").write_text("WHERE = 'proj'\n")
    (tmp_path / "helper.py").write_text("WHERE = 'working folder'\n")  # what the wrong sys.path[0] would import
    out = tmp_path / "seen.json"
    run([venv.cadence, "run", os.path.join("proj", "train.py"), out], cwd=tmp_path)
    seen = json.loads(out.read_text())
    assert os.path.realpath(seen["path0"]) == os.path.realpath(tmp_path / "proj")
    assert seen["helper"] == "proj" and seen["patched"] and seen["argv"] == [os.path.join("proj", "train.py"), str(out)]


@pytest.mark.slow  # trains in a child of cadence run, on transformers
def test_cadence_run_without_the_hook_says_children_train_on_transformers(tmp_path):
    """cadence from a source folder on PYTHONPATH (no installed hook): `cadence run` warns, and indeed the child the
    script starts trains on transformers."""
    python = make_venv(tmp_path / "bare", install=None)
    starter = tmp_path / "starter.py"
    starter.write_text(f"import subprocess, sys\nsubprocess.run([sys.executable, {os.path.join(WORKERS, 'patch_child_worker.py')!r}, "
                       f"{str(tmp_path / 'out')!r}], check=True)\n")
    proc = run([python, "-m", "cadence", "run", starter], env=clean_env(PYTHONPATH=os.path.join(ROOT, "src")))
    assert "cadence_patch.pth is not in this Python's site-packages" in proc.stderr
    mro = json.loads((tmp_path / "out" / "rank0.json").read_text())["mro"]
    assert "transformers.trainer.Trainer" in mro and "cadence.trainer.Trainer" not in mro


# ---------------------------------------------------------------- done when: the libraries' command lines, launchers


def trl_cli_inputs(case: str, tmp_path) -> list[str]:
    sys.path.insert(0, HERE)
    import trl_worker

    model_dir = trl_worker.saved(trl_worker.tokenizer(), str(tmp_path))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with open(data_dir / "train.jsonl", "w") as f:
        for row in trl_worker.rows(case):
            f.write(json.dumps(row) + "\n")
    flags = ["--model_name_or_path", model_dir, "--dataset_name", str(data_dir), "--max_steps", "3",
             "--per_device_train_batch_size", "4", "--logging_steps", "1", "--report_to", "none", "--save_strategy",
             "steps", "--save_steps", "3", "--use_cpu", "--bf16", "false", "--seed", "7", "--max_length", "64"]
    return flags + (["--beta", "0.1"] if case == "dpo" else [])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(TRL), reason="trl's console script is not installed")
@pytest.mark.parametrize("case", ["sft_text", "dpo"])
def test_trl_command_line_trains_on_cadence_in_its_child(venv, case, tmp_path):
    """`cadence run $(which trl) sft|dpo ...`: trl re-launches the training through `accelerate launch` in a child
    Python, which patches itself through the hook. The child's checkpoint carries cadence's manifest (transformers'
    run's does not) and the run ends on transformers' weights and losses."""
    flags = trl_cli_inputs(case, tmp_path)
    command = case.split("_")[0]
    outs = {name: tmp_path / name for name in ("hf", "cadence")}
    run([sys.executable, TRL, command, *flags, "--output_dir", outs["hf"]])
    run([venv.cadence, "run", TRL, command, *flags, "--output_dir", outs["cadence"]])
    assert not (outs["hf"] / "checkpoint-3" / "checkpoint_manifest.json").exists()  # the reference is transformers'
    assert (outs["cadence"] / "checkpoint-3" / "checkpoint_manifest.json").exists()  # written by cadence in the child
    from safetensors.torch import load_file

    theirs, ours = (load_file(outs[n] / "model.safetensors") for n in ("hf", "cadence"))
    assert theirs.keys() == ours.keys()
    assert max((theirs[k] - ours[k]).abs().max().item() for k in theirs) <= TOL
    logs = {n: [h for h in json.loads((outs[n] / "checkpoint-3" / "trainer_state.json").read_text())["log_history"]
                if "loss" in h] for n in outs}
    assert len(logs["hf"]) == 3 and [h["step"] for h in logs["cadence"]] == [1, 2, 3]
    for a, b in zip(logs["hf"], logs["cadence"]):
        assert abs(a["loss"] - b["loss"]) <= TOL, (a, b)


def rank_files(out) -> list[dict]:
    return [json.loads(open(p).read()) for p in sorted(glob.glob(os.path.join(str(out), "rank*.json")))]


@pytest.mark.slow
def test_accelerate_launch_and_a_script_starting_torchrun_train_on_cadence_in_every_process(venv, tmp_path):
    """`cadence run accelerate launch --num_processes 2 script.py` and `cadence run script.py` where the script starts
    torchrun itself: every rank builds its transformers.Trainer subclass on cadence and the run equals
    `torchrun -m cadence run script.py` (float64: 1e-5 is far above reduction-order noise, ~1e-15)."""
    worker = os.path.join(WORKERS, "patch_child_worker.py")
    outs = {name: tmp_path / name for name in ("torchrun", "accelerate", "own_torchrun")}
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "cadence", "run",
         worker, outs["torchrun"]], env=dist_exit.worker_env())
    run([venv.cadence, "run", "accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no", worker, outs["accelerate"]])
    run([venv.cadence, "run", worker, outs["own_torchrun"], "--torchrun", "2"])
    reference = torch.load(outs["torchrun"] / "result.pt")
    for name, out in outs.items():
        ranks = rank_files(out)
        assert [r["world"] for r in ranks] == [2, 2], (name, ranks)
        assert all("cadence.trainer.Trainer" in r["mro"] for r in ranks), (name, ranks)
        result = torch.load(out / "result.pt")
        assert [(s, k) for s, k, _ in result["losses"]] == [(s, k) for s, k, _ in reference["losses"]]
        assert max(abs(a[2] - b[2]) for a, b in zip(result["losses"], reference["losses"])) <= TOL
        for k, w in reference["weights"].items():
            assert (w - result["weights"][k]).abs().max().item() <= TOL, (name, k)


# ---------------------------------------------------------------- transformers 4.x's tokenizer=


def test_tokenizer_keyword_and_attribute_as_in_transformers_4(tmp_path, caplog):
    """`Trainer(tokenizer=tok)` (4.x's name, removed in 5) is `processing_class=tok` with 4.57's FutureWarning: the
    default collator pads with it and training matches `processing_class=tok` exactly; `trainer.tokenizer` reads and
    sets processing_class with 4.57's logged warning; both keywords at once are refused, as in 4.57."""
    import cadence
    import tiny

    tok = tiny.word_tokenizer()
    rows = [{"input_ids": tok(" ".join(f"w{(i * 3 + j) % 30}" for j in range(2 + i % 5)))["input_ids"],
             "labels": float(i % 3)} for i in range(12)]  # rows of 2..6 tokens: the collator must pad

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(32, 4)
            self.out = torch.nn.Linear(4, 1)

        def forward(self, input_ids, attention_mask, labels=None):
            pooled = (self.emb(input_ids) * attention_mask[..., None]).sum(1) / attention_mask.sum(1, keepdim=True)
            pred = self.out(pooled).squeeze(-1)
            return {"loss": torch.nn.functional.mse_loss(pred, labels.float()), "logits": pred}

    def train(**kw):
        args = tiny.make_args(tmp_path, max_steps=3, per_device_train_batch_size=4, logging_steps=1, use_cpu=True)
        trainer = cadence.Trainer(Model(), args, train_dataset=rows, **kw)
        trainer.train()
        return trainer, [h["loss"] for h in trainer.state.log_history if "loss" in h]

    with pytest.warns(FutureWarning, match="`tokenizer` is deprecated .* `Trainer.__init__`. Use `processing_class`"):
        old, old_losses = train(tokenizer=tok)
    new, new_losses = train(processing_class=tok)
    assert old.processing_class is tok and old_losses == new_losses and len(old_losses) == 3
    with caplog.at_level("WARNING", logger="cadence.trainer"):
        assert old.tokenizer is tok
        other = tiny.word_tokenizer("left")
        old.tokenizer = other
    assert old.processing_class is other
    assert [r.getMessage()[:35] for r in caplog.records] == ["Trainer.tokenizer is now deprecated"] * 2
    with pytest.raises(ValueError, match="Both `tokenizer` and `processing_class`"):
        cadence.Trainer(Model(), tiny.make_args(tmp_path), tokenizer=tok, processing_class=tok)
    import inspect

    assert "tokenizer" not in inspect.signature(cadence.Trainer.__init__).parameters  # transformers 5's signature
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # processing_class alone: no warning
        cadence.Trainer(Model(), tiny.make_args(tmp_path), processing_class=tok)
