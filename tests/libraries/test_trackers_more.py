"""The report_to trackers added after the first five, each read back offline by its own library or files:
DVCLive's TSV/YAML/JSON files, Aim's repository (indexed and read with Aim's own Repo/Run), Comet's offline
archive (messages.json, as ``comet offline`` reads it), ClearML's offline session (metrics.jsonl, task.json),
CodeCarbon's emissions.csv, SwanLab's local store (SwanBoard's database and tag files), and Kubeflow Trainer's
progress reports received by a local HTTP server on 127.0.0.1 (compared with transformers' KubeflowCallback
on the same server). No tracker is mocked.

Every run logs each step; the reference for the logged numbers is ``trainer.state.log_history``: all these
trackers keep float64, so equality is exact. A test skips only where its package cannot be installed here
(SwanLab pins protobuf<7, which the shared environment's protobuf 7 excludes)."""

import csv
import glob
import importlib.util
import json
import logging
import os
import random
import subprocess
import sys
import threading
import types
import zipfile
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from cadence import Trainer, TrainerCallback, TrainingArguments
from cadence.integrations import registry
from tiny import RegressionDataset, RegressionModel, stop_at
from repo_paths import TESTS, IMPORT_PATHS

STEPS, SAVE = 8, 4


def make_trainer(out_dir, report_to, max_steps=STEPS, callbacks=None, **kw):
    args = TrainingArguments(output_dir=str(out_dir), report_to=report_to, logging_steps=1, max_steps=max_steps,
                             save_steps=SAVE, per_device_train_batch_size=8, learning_rate=0.05, disable_tqdm=True,
                             use_cpu=True, eval_strategy="steps", eval_steps=SAVE, **kw)
    return Trainer(RegressionModel(), args, train_dataset=RegressionDataset(),
                   eval_dataset=RegressionDataset(16, seed=1), callbacks=callbacks)


def history(trainer, key):
    """{step: value} of ``key`` in the Trainer's log history."""
    return {h["step"]: h[key] for h in trainer.state.log_history if key in h}


def tracker(trainer, name):
    return next(cb for cb in trainer.callback_handler.callbacks if type(cb).__name__ == name)


def needs(package):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} is not installed")


class Draws(TrainerCallback):
    """Draws from Python's `random` as each step begins (what a training's own shuffling would get)."""

    def __init__(self):
        self.values = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.values.append(random.random())


def draws_without_trackers(out_dir, **kw):
    trainer = make_trainer(out_dir, "none", callbacks=[Draws()], **kw)
    trainer.train()
    return tracker(trainer, "Draws").values


# ----------------------------------------------------------------------------------------- registry


def test_all_picks_up_the_installed_trackers_as_transformers_does(monkeypatch):
    for name in ("COMET_API_KEY", "COMET_CONFIG", "KUBEFLOW_TRAINER_SERVER_URL", "DISABLE_KUBEFLOW_INTEGRATION",
                 "DISABLE_MLFLOW_INTEGRATION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")  # no ~/.comet.config
    installed = [n for n in ("dvclive", "codecarbon", "clearml", "swanlab") if importlib.util.find_spec(n)]
    plain = TrainingArguments(report_to="all").report_to
    assert [n for n in plain if n in installed] == installed
    assert "comet_ml" not in plain and "kubeflow" not in plain and "aim" not in plain  # not configured / not HF's
    monkeypatch.setenv("COMET_API_KEY", "x" * 20)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "http://127.0.0.1:1/status")
    configured = TrainingArguments(report_to="all").report_to
    assert ("comet_ml" in configured) == bool(importlib.util.find_spec("comet_ml")) and "kubeflow" in configured
    monkeypatch.setenv("DISABLE_KUBEFLOW_INTEGRATION", "TRUE")  # transformers' switch
    assert "kubeflow" not in TrainingArguments(report_to="all").report_to


def test_the_new_names_are_transformers_names():
    # read from transformers' source: importing integration_utils imports comet_ml, whose error reporting
    # then tries the network for half a minute here
    import re

    source = os.path.join(os.path.dirname(importlib.util.find_spec("transformers").origin), "integrations",
                          "integration_utils.py")
    table = open(source).read().split("INTEGRATION_TO_CALLBACK = {", 1)[1].split("}", 1)[0]
    hf = dict(re.findall(r'"(\w+)": (\w+),', table))
    for name in ("comet_ml", "dvclive", "codecarbon", "clearml", "swanlab", "kubeflow"):
        assert registry.INTEGRATIONS[name].callback == hf[name]
    assert registry.INTEGRATIONS["aim"].callback == "AimCallback"  # Aim's own callback's name


def test_import_cadence_imports_no_tracker_package():
    code = ("import sys, cadence; from cadence.integrations import registry; registry.available_integrations();"
            "from cadence.integrations import comet, dvclive, aim, clearml, codecarbon, swanlab, kubeflow;"
            "print([m for m in ('comet_ml', 'dvclive', 'aim', 'clearml', 'codecarbon', 'swanlab')"
            " if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "COMET_API_KEY": "x" * 20})
    assert out.stdout.strip() == "[]"


def test_kubeflow_without_its_server_is_refused_before_training(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_URL", raising=False)
    with pytest.raises(ValueError, match="KUBEFLOW_TRAINER_SERVER_URL"):
        make_trainer(tmp_path / "out", "kubeflow")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "http://127.0.0.1:1/status")
    monkeypatch.setenv("DISABLE_KUBEFLOW_INTEGRATION", "TRUE")
    with pytest.raises(ValueError, match="DISABLE_KUBEFLOW_INTEGRATION=TRUE turns off"):
        make_trainer(tmp_path / "out", "kubeflow")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------- Kubeflow


class StatusServer:
    """A Kubeflow Trainer controller's status endpoint on 127.0.0.1: keeps each POST (headers, JSON body)."""

    def __init__(self, status=200):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((dict(self.headers), json.loads(body)))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/runtime-status"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def statuses(self):
        return [body["trainerStatus"] for _, body in self.received]


def kubeflow_env(monkeypatch, tmp_path, url):
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", url)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", raising=False)
    monkeypatch.delenv("DISABLE_KUBEFLOW_INTEGRATION", raising=False)


def metric_values(status):
    return {m["name"]: m["value"] for m in status.get("metrics", [])}


def test_kubeflow_reports_progress_as_transformers_does(tmp_path, monkeypatch):
    with StatusServer() as server:
        kubeflow_env(monkeypatch, tmp_path, server.url)
        trainer = make_trainer(tmp_path / "out", "kubeflow")
        tracker(trainer, "KubeflowCallback")._MIN_UPDATE_INTERVAL = 0  # every step (the default: one per 5 s)
        trainer.train()
        ours = server.statuses()
        headers = [h for h, _ in server.received]
        server.received.clear()

        import transformers

        hf_args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "hf"), report_to="kubeflow", logging_steps=1, max_steps=STEPS, save_steps=SAVE,
            per_device_train_batch_size=8, learning_rate=0.05, disable_tqdm=True, use_cpu=True,
            eval_strategy="steps", eval_steps=SAVE)
        hf = transformers.Trainer(RegressionModel(), hf_args, train_dataset=RegressionDataset(),
                                  eval_dataset=RegressionDataset(16, seed=1))
        hf_kubeflow = next(cb for cb in hf.callback_handler.callbacks if type(cb).__name__ == "KubeflowCallback")
        hf_kubeflow._MIN_UPDATE_INTERVAL = 0
        hf.train()
        theirs = server.statuses()

    assert all(h["Authorization"] == "Bearer secret-token" and h["Content-Type"] == "application/json" for h in headers)
    # the same updates: 0% with the step count, one per optimizer step (capped at 99%), 100% at the end
    assert [s["progressPercentage"] for s in ours] == [s["progressPercentage"] for s in theirs] == [
        0, 12, 25, 37, 50, 62, 75, 87, 99, 100]
    assert metric_values(ours[0]) == metric_values(theirs[0]) == {"total_steps": "8"}
    for step, (mine, hf_status) in enumerate(zip(ours[1:-1], theirs[1:-1]), 1):
        assert set(mine) == set(hf_status) == {"lastUpdatedTime", "progressPercentage", "estimatedRemainingSeconds",
                                               "metrics"}
        m, h = metric_values(mine), metric_values(hf_status)
        assert set(m) == set(h) and (m["current_step"], m["total_steps"]) == (str(step), "8")
        assert m["current_epoch"] == h["current_epoch"]
        if step > 1:  # the latest logged loss: that of the step before (a step's log follows its step end)
            assert float(m["loss"]) == history(trainer, "loss")[step - 1]
    assert ours[-1]["estimatedRemainingSeconds"] == theirs[-1]["estimatedRemainingSeconds"] == 0
    assert float(metric_values(ours[-1])["train_loss"]) == trainer.state.log_history[-1]["train_loss"]


def test_kubeflow_throttles_to_one_update_per_interval(tmp_path, monkeypatch):
    with StatusServer() as server:
        kubeflow_env(monkeypatch, tmp_path, server.url)
        make_trainer(tmp_path / "out", "kubeflow").train()  # 8 steps take well under the 5 s interval
        assert [s["progressPercentage"] for s in server.statuses()] == [0, 100]


def test_kubeflow_server_error_switches_it_off_and_training_goes_on(tmp_path, monkeypatch, caplog):
    with StatusServer(status=500) as server, caplog.at_level(logging.ERROR):
        kubeflow_env(monkeypatch, tmp_path, server.url)
        trainer = make_trainer(tmp_path / "out", "kubeflow")
        trainer.train()
        assert len(server.received) == 1  # the first update failed; nothing was sent after it
    assert trainer.state.global_step == STEPS
    assert "report_to 'kubeflow' failed" in caplog.text and "HTTP Error 500" in caplog.text


# ----------------------------------------------------------------------------------------- DVCLive


def read_dvclive_metric(folder, name):
    with open(os.path.join(folder, "plots", "metrics", name + ".tsv"), newline="") as f:
        return [(int(r["step"]), float(r[os.path.basename(name)])) for r in csv.DictReader(f, delimiter="\t")]


@needs("dvclive")
def test_dvclive_files_hold_every_log(tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)  # DVCLive writes ./dvclive, as with transformers
    trainer = make_trainer(tmp_path / "out", "dvclive", callbacks=[Draws()])
    trainer.train()
    assert tracker(trainer, "Draws").values == draws_without_trackers(tmp_path / "plain")
    folder = tmp_path / "dvclive"
    assert read_dvclive_metric(folder, "loss") == sorted(history(trainer, "loss").items())
    assert read_dvclive_metric(folder, "eval/loss") == sorted(history(trainer, "eval_loss").items())
    params = yaml.safe_load((folder / "params.yaml").read_text())
    assert params["learning_rate"] == 0.05 and params["max_steps"] == STEPS
    summary = json.loads((folder / "metrics.json").read_text())
    assert summary["train"]["loss"] == trainer.state.log_history[-1]["train_loss"]  # train_loss -> train/loss
    assert summary["step"] == STEPS


@needs("dvclive")
def test_dvclive_resumed_run_continues_its_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = make_trainer(tmp_path / "out", "dvclive", callbacks=[stop_at(6)])
    first.train()
    resumed = make_trainer(tmp_path / "out", "dvclive")
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / f"checkpoint-{SAVE}"))
    rows = read_dvclive_metric(tmp_path / "dvclive", "loss")
    # the interrupted run's steps 1-6, then the resumed run's 5-8 appended (not a new folder)
    assert [s for s, _ in rows] == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    assert rows[:4] == sorted(history(first, "loss").items())[:4]
    assert rows[6:] == [(s, v) for s, v in sorted(history(resumed, "loss").items()) if s >= 5]


# ----------------------------------------------------------------------------------------- Aim


def read_aim_run(repo_path, run_hash):
    """Aim's own reader: index the finished run (as `aim up` does), then read it."""
    from aim import Repo, Run
    from aim.sdk.index_manager import RepoIndexManager

    repo = Repo.from_path(str(repo_path))
    RepoIndexManager.get_index_manager(repo).index(run_hash)
    run = Run(run_hash, repo=repo, read_only=True)
    metrics = {}
    for seq in run.metrics():
        steps, (values, _epochs, _times) = seq.data.items_list()
        metrics[(seq.name, seq.context.to_dict().get("subset"))] = dict(zip(steps, values))
    return run["hparams"], metrics


@needs("aim")
def test_aim_repo_holds_params_and_metrics_and_a_resumed_run_continues_it(tmp_path, monkeypatch):
    monkeypatch.setenv("AIM_REPO", str(tmp_path / "aim"))
    first = make_trainer(tmp_path / "out", "aim", callbacks=[stop_at(6)])
    first.train()
    run_hash = tracker(first, "AimCallback").run_id
    hparams, metrics = read_aim_run(tmp_path / "aim", run_hash)
    assert hparams["learning_rate"] == 0.05 and hparams["max_steps"] == STEPS
    assert metrics[("loss", None)] == history(first, "loss")
    assert metrics[("loss", "eval")] == history(first, "eval_loss")

    resumed = make_trainer(tmp_path / "out", "aim")
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / f"checkpoint-{SAVE}"))
    assert tracker(resumed, "AimCallback").run_id == run_hash  # the same Aim run, continued
    _, metrics = read_aim_run(tmp_path / "aim", run_hash)
    assert metrics[("loss", None)] == {**history(first, "loss"), **history(resumed, "loss")}
    # train_loss is metric loss in context train: each training's final number, at its last step
    assert metrics[("loss", "train")] == {**history(first, "train_loss"), **history(resumed, "train_loss")}
    assert metrics[("loss", "eval")] == {**history(first, "eval_loss"), **history(resumed, "eval_loss")}


# ----------------------------------------------------------------------------------------- Comet


def read_comet_archive(path):
    """The offline archive as `comet offline` reads it: experiment.json and the messages of messages.json."""
    with zipfile.ZipFile(path) as archive:
        experiment = json.loads(archive.read("experiment.json"))
        messages = [json.loads(line) for line in archive.read("messages.json").decode().splitlines() if line]
    metrics, params = {}, {}
    for message in messages:
        payload = message["payload"]
        if message["type"] == "metric_msg":
            metrics.setdefault(payload["metric"]["metricName"], {})[payload["metric"]["step"]] = \
                payload["metric"]["metricValue"]
        elif message["type"] == "parameter_msg":
            param = payload.get("param") or payload["params"]  # "params": a list value
            if param["source"] == "manual":
                params[param["paramName"]] = param["paramValue"]
    return experiment, metrics, params


@needs("comet_ml")
def test_comet_offline_archive_holds_params_and_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("COMET_START_ONLINE", "false")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet"))
    monkeypatch.setenv("COMET_AUTO_LOG_CO2", "false")  # Comet would start CodeCarbon itself
    monkeypatch.delenv("COMET_MODE", raising=False)
    trainer = make_trainer(tmp_path / "out", "comet_ml", run_name="tiny-run", callbacks=[Draws()])
    trainer.train()
    key = tracker(trainer, "CometCallback").run_id
    # Comet draws from `random` on import and start (its archive's name): the training's stream is as without it
    assert tracker(trainer, "Draws").values == draws_without_trackers(tmp_path / "plain")
    archives = glob.glob(str(tmp_path / "comet" / "*.zip"))
    assert len(archives) == 1 and os.path.basename(archives[0]).startswith(key)  # written when training ended
    experiment, metrics, params = read_comet_archive(archives[0])
    assert experiment["offline_id"] == key
    assert metrics["train/loss"] == history(trainer, "loss")
    assert metrics["eval/loss"] == history(trainer, "eval_loss")
    assert metrics["train/train_loss"] == history(trainer, "train_loss")  # transformers' names: rewrite_logs
    assert params["args|learning_rate"] == 0.05 and params["args|run_name"] == "tiny-run"


def test_comet_mode_must_be_one_of_transformers_modes(tmp_path, monkeypatch):
    monkeypatch.setenv("COMET_MODE", "sometimes")
    if importlib.util.find_spec("comet_ml") is None:
        pytest.skip("comet_ml is not installed")
    with pytest.raises(ValueError, match="COMET_MODE='sometimes' is invalid"):
        make_trainer(tmp_path / "out", "comet_ml")


# ----------------------------------------------------------------------------------------- ClearML


@pytest.mark.slow  # ~40 s: ClearML's start and close (its flushes) in a child process
@needs("clearml")
def test_clearml_offline_session_holds_hyperparameters_and_scalars(tmp_path):
    # ClearML patches the process (excepthook, atexit, stdout): the run happens in a child process, whose script
    # lies outside any git repository (ClearML's repository scan of this checkout can take minutes on a busy
    # machine) and whose ClearML reports from a thread, not a forked reporter process that could outlive it
    (tmp_path / "clearml.conf").write_text("sdk { development { report_use_subprocess: false } }\n")
    script = tmp_path / "run_clearml.py"
    script.write_text(f"""
import sys, json, faulthandler
faulthandler.dump_traceback_later(150, exit=True)  # a hang shows where
sys.path[:0] = {[*IMPORT_PATHS, os.path.join(TESTS, '..', 'src')]!r}
from test_trackers_more import SAVE, Draws, draws_without_trackers, make_trainer, stop_at, tracker
trainer = make_trainer({str(tmp_path / 'out')!r}, "clearml", callbacks=[Draws()])
trainer.train()
same_draws = tracker(trainer, "Draws").values == draws_without_trackers({str(tmp_path / 'plain')!r})
first = make_trainer({str(tmp_path / 'out2')!r}, "clearml", callbacks=[stop_at(6)])
first.train()
resumed = make_trainer({str(tmp_path / 'out2')!r}, "clearml")
resumed.train(resume_from_checkpoint={str(tmp_path / 'out2' / 'checkpoint-4')!r})
print(json.dumps({{"task": tracker(trainer, "ClearMLCallback").run_id, "log_history": trainer.state.log_history,
                  "same_draws": same_draws, "tasks": [tracker(t, "ClearMLCallback").run_id for t in (first, resumed)],
                  "losses": [[[h["step"], h["loss"]] for h in t.state.log_history if "loss" in h]
                             for t in (first, resumed)]}}))
""")
    env = {**os.environ, "CLEARML_OFFLINE_MODE": "1", "CLEARML_CACHE_DIR": str(tmp_path / "cache"),
           "HOME": str(tmp_path), "CLEARML_CONFIG_FILE": str(tmp_path / "clearml.conf"),
           "CLEARML_PROJECT": "cadence-tests", "CLEARML_TASK": "tiny"}
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:  # files, not pipes
        code = subprocess.run([sys.executable, str(script)], stdout=stdout, stderr=stderr, env=env, cwd=tmp_path,
                              timeout=200).returncode
    out = types.SimpleNamespace(returncode=code, stdout=(tmp_path / "stdout").read_text(),
                                stderr=(tmp_path / "stderr").read_text())
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    def session(task):
        folders = glob.glob(str(tmp_path / "**" / "offline" / task), recursive=True)
        assert len(folders) == 1, out.stderr[-2000:]
        with open(os.path.join(folders[0], "metrics.jsonl")) as f:
            events = [e for line in f if line.strip() for e in json.loads(line)]
        return folders[0], [e for e in events if e["type"] == "training_stats_scalar"]

    folder, events = session(result["task"])
    scalars = {}
    for e in events:
        scalars.setdefault((e["metric"], e["variant"]), {})[e["iter"]] = e["value"]
    log_history = result["log_history"]
    assert result["same_draws"]  # ClearML draws from `random` (on import, Task.init): not from the training's stream
    assert scalars[("train", "loss")] == {h["step"]: h["loss"] for h in log_history if "loss" in h}
    assert scalars[("eval", "loss")] == {h["step"]: h["eval_loss"] for h in log_history if "eval_loss" in h}
    assert list(scalars[("Summary", "train_loss")].values()) == [log_history[-1]["train_loss"]]  # a single value
    task = json.loads(open(os.path.join(folder, "task.json")).read())
    assert task["name"] == "tiny" and task["project_name"] == "cadence-tests"
    assert task["hyperparams"]["Transformers"]["learning_rate"]["value"] == "0.05"

    # a resumed training continues the task, reporting at the global steps (ClearML would add an offset)
    first_task, resumed_task = result["tasks"]
    assert first_task == resumed_task
    _, events = session(first_task)
    first_losses, resumed_losses = result["losses"]
    assert [[e["iter"], e["value"]] for e in events if (e["metric"], e["variant"]) == ("train", "loss")] == \
        first_losses + [row for row in resumed_losses if row[0] > SAVE]


# ----------------------------------------------------------------------------------------- CodeCarbon


@needs("codecarbon")
def test_codecarbon_offline_measures_the_training_into_emissions_csv(tmp_path, monkeypatch):
    monkeypatch.setenv("CODECARBON_COUNTRY_ISO_CODE", "FRA")  # offline: no location lookup
    trainer = make_trainer(tmp_path / "out", "codecarbon", max_steps=4)
    trainer.evaluate()  # outside train(): nothing measured, nothing started
    assert tracker(trainer, "CodeCarbonCallback").tracker is None
    output = trainer.train()
    with open(tmp_path / "out" / "emissions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and rows[0]["run_id"] == tracker(trainer, "CodeCarbonCallback").run_id
    assert rows[0]["country_iso_code"] == "FRA"
    assert 0 < float(rows[0]["duration"]) < output.metrics["train_runtime"] + 5  # train() only, with its set-up
    assert float(rows[0]["energy_consumed"]) > 0 and float(rows[0]["emissions"]) > 0


# ----------------------------------------------------------------------------------------- SwanLab


def swanlab_local_available():
    return importlib.util.find_spec("swanlab") is not None and importlib.util.find_spec("swanboard") is not None


@pytest.mark.skipif(not swanlab_local_available(), reason="swanlab[dashboard] is not installed (it needs protobuf<7)")
def test_swanlab_local_store_holds_config_and_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("SWANLAB_MODE", "local")
    monkeypatch.setenv("SWANLAB_LOG_DIR", str(tmp_path / "swanlog"))
    trainer = make_trainer(tmp_path / "out", "swanlab", run_name="tiny-run", callbacks=[Draws()])
    trainer.train()
    # SwanLab draws from `random` (on import, its run id): the training's stream is as without it
    assert tracker(trainer, "Draws").values == draws_without_trackers(tmp_path / "plain")
    run_id = tracker(trainer, "SwanLabCallback").run_id

    import yaml
    from swanboard.controller.utils import LOGS_CONFIGS, get_tag_files, read_tag_data
    from swanboard.db import Experiment, Tag, connect

    connect(str(tmp_path / "swanlog"))  # SwanBoard's database: swanlog/runs.swanlab
    experiment = Experiment.get(Experiment.name == "tiny-run")
    assert experiment.run_id.endswith(run_id)
    run_dir = tmp_path / "swanlog" / experiment.run_id

    def curve(tag):
        folder = run_dir / "logs" / Tag.get(Tag.experiment_id == experiment.id, Tag.name == tag).folder
        rows = [r for f in get_tag_files(str(folder), LOGS_CONFIGS) for r in read_tag_data(str(folder / f))]
        return {r["index"]: r["data"] for r in rows}

    assert curve("train/loss") == history(trainer, "loss")
    assert curve("eval/loss") == history(trainer, "eval_loss")
    assert curve("single_value/train_loss") == history(trainer, "train_loss")
    config = yaml.safe_load((run_dir / "files" / "config.yaml").read_text())
    assert config["learning_rate"]["value"] == 0.05


@needs("comet_ml")
def test_comet_resumed_training_continues_the_experiment_key(tmp_path, monkeypatch):
    monkeypatch.setenv("COMET_START_ONLINE", "false")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet"))
    monkeypatch.setenv("COMET_AUTO_LOG_CO2", "false")
    monkeypatch.delenv("COMET_MODE", raising=False)
    first = make_trainer(tmp_path / "out", "comet_ml", callbacks=[stop_at(6)])
    first.train()
    resumed = make_trainer(tmp_path / "out", "comet_ml")
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / f"checkpoint-{SAVE}"))
    key = tracker(first, "CometCallback").run_id
    assert tracker(resumed, "CometCallback").run_id == key
    archives = sorted(glob.glob(str(tmp_path / "comet" / "*.zip")), key=os.path.getmtime)
    # one per training, Comet merges them into one experiment on upload (Comet's name for the second came from
    # `random`, which set_seed had put back where it was for the first: the second replaced the first)
    assert len(archives) == 2
    (_, first_metrics, first_params), (second, second_metrics, second_params) = map(read_comet_archive, archives)
    assert second["offline_id"] == key and second["resume_strategy"] == "get"
    assert first_metrics["train/loss"] == history(first, "loss")
    assert second_metrics["train/loss"] == {s: v for s, v in history(resumed, "loss").items() if s > SAVE}
    assert "args|learning_rate" in first_params and "args|learning_rate" not in second_params  # logged once


@needs("dvclive")
def test_a_tracker_whose_library_fails_is_switched_off_and_training_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dvclive").write_text("a file where DVCLive wants its folder")
    trainer = make_trainer(tmp_path / "out", ["dvclive", "jsonl"])
    with caplog.at_level(logging.ERROR):
        trainer.train()
    assert trainer.state.global_step == STEPS
    assert "report_to 'dvclive' failed in on_train_begin" in caplog.text and "switched off" in caplog.text
    from cadence.integrations.jsonl import read_log_history

    assert len(read_log_history(tmp_path / "out" / "log_history.jsonl")) == len(trainer.state.log_history)


@pytest.mark.skipif(not swanlab_local_available(), reason="swanlab[dashboard] is not installed (it needs protobuf<7)")
def test_swanlab_resumed_training_keeps_the_run_id(tmp_path, monkeypatch):
    monkeypatch.setenv("SWANLAB_MODE", "local")
    monkeypatch.setenv("SWANLAB_LOG_DIR", str(tmp_path / "swanlog"))
    first = make_trainer(tmp_path / "out", "swanlab", callbacks=[stop_at(6)])
    first.train()
    resumed = make_trainer(tmp_path / "out", "swanlab")
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / f"checkpoint-{SAVE}"))
    run_id = tracker(first, "SwanLabCallback").run_id
    assert tracker(resumed, "SwanLabCallback").run_id == run_id  # init(id=..., resume="allow")

    from swanboard.controller.utils import LOGS_CONFIGS, get_tag_files, read_tag_data
    from swanboard.db import Experiment, Tag, connect

    def curve(experiment, tag):
        folder = tmp_path / "swanlog" / experiment.run_id / "logs" / Tag.get(
            Tag.experiment_id == experiment.id, Tag.name == tag).folder
        return {r["index"]: r["data"] for f in get_tag_files(str(folder), LOGS_CONFIGS)
                for r in read_tag_data(str(folder / f))}

    # SwanLab's local store keeps a resumed run as a second experiment of the same id (it continues runs in its
    # cloud); each holds its own steps
    connect(str(tmp_path / "swanlog"))
    experiments = list(Experiment.select().order_by(Experiment.id))
    assert [e.run_id.endswith(run_id) for e in experiments] == [True, True]
    assert curve(experiments[0], "train/loss") == history(first, "loss")
    assert curve(experiments[1], "train/loss") == {s: v for s, v in history(resumed, "loss").items() if s > SAVE}


def test_kubeflow_resumed_training_starts_at_its_progress(tmp_path, monkeypatch):
    with StatusServer() as server:
        kubeflow_env(monkeypatch, tmp_path, server.url)
        # inside a TrainJob report_to="none" reports to kubeflow too, as in transformers 5.x
        make_trainer(tmp_path / "out", "none", callbacks=[stop_at(6)]).train()
        first_run = len(server.statuses())
        resumed = make_trainer(tmp_path / "out", "kubeflow")
        tracker(resumed, "KubeflowCallback")._MIN_UPDATE_INTERVAL = 0
        resumed.train(resume_from_checkpoint=str(tmp_path / "out" / f"checkpoint-{SAVE}"))
        statuses = server.statuses()[first_run:]
    assert [s["progressPercentage"] for s in statuses] == [50, 62, 75, 87, 99, 100]
    assert [metric_values(s)["current_step"] for s in statuses[1:-1]] == ["5", "6", "7", "8"]
    assert all(s["estimatedRemainingSeconds"] >= 0 for s in statuses[1:])
