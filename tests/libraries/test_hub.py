"""Pushes to the Hub through huggingface_hub itself, against a local HTTP server standing in for the Hub API
(tests/workers/hub_server.py; HF_ENDPOINT points at it). Each run is a subprocess (tests/workers/hub_worker.py), since
huggingface_hub reads HF_ENDPOINT, HF_HUB_OFFLINE and HF_HUB_DISABLE_XET when it is imported."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")

from hub_server import HubServer  # noqa: E402
from repo_paths import TESTS, WORKERS

HERE = TESTS
SRC = os.path.join(os.path.dirname(HERE), "src")


def run_worker(mode: str, out: Path, options: dict, **env) -> tuple[dict, str]:
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([HERE, SRC]),
               "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", **env}
    environ.pop("HF_TOKEN", None)  # only the token the test passes
    proc = subprocess.run([sys.executable, os.path.join(WORKERS, "hub_worker.py"), mode, str(out), json.dumps(options)],
                          env=environ, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


def test_offline_mode_is_one_clear_error_within_seconds(tmp_path):
    out = tmp_path / "out"
    result, _ = run_worker("init", out, {"args": {"push_to_hub": True, "hub_model_id": "me/tiny"}}, HF_HUB_OFFLINE="1")
    assert result["error_type"] == "HubUnreachableError"
    assert "cannot be reached" in result["error"] and "HF_HUB_OFFLINE=1" in result["error"]
    assert str(out) in result["error"]  # where the files are
    assert result["seconds"] < 5


def test_unreachable_hub_at_push_keeps_the_files_and_says_where(tmp_path):
    out = tmp_path / "out"
    options = {"args": {"max_steps": 4, "save_strategy": "no"}, "push": {"commit_message": "final"}}
    result, _ = run_worker("train", out, options, HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}")
    assert result["error_type"] == "HubUnreachableError" and "cannot be reached" in result["error"]
    assert str(out) in result["error"] and result["seconds"] < 5
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()  # saved before the push


def test_push_to_hub_at_end_uploads_output_dir_without_checkpoints(tmp_path):
    out = tmp_path / "out"
    options = {"args": {"max_steps": 8, "save_strategy": "steps", "save_steps": 4, "push_to_hub": True,
                        "hub_model_id": "tiny-regression", "hub_strategy": "end", "hub_private_repo": True,
                        "hub_token": "hf_cadence_test"},
               "push": {"commit_message": "final push", "license": "apache-2.0"}}
    with HubServer(tmp_path / "hub") as hub:
        result, _ = run_worker("train", out, options, HF_ENDPOINT=hub.url)
    assert "error" not in result, result
    assert [(r["repo_id"], r["visibility"]) for r in hub.repos] == [("cadence-user/tiny-regression", "private")]
    assert hub.authorizations == {"Bearer hf_cadence_test"}  # hub_token on every request
    # hub_strategy="end": the checkpoint saves pushed nothing; push_to_hub made one commit on main
    assert [(c["repo"], c["revision"], c["message"]) for c in hub.commits] == [
        ("cadence-user/tiny-regression", "main", "final push")]
    files = hub.commits[0]["files"]
    assert {"model.safetensors", "README.md", "training_args.bin"} <= set(files)
    assert not any(f.startswith("checkpoint-") for f in files) and hub.unknown == []
    remote = tmp_path / "hub" / "cadence-user" / "tiny-regression" / "main"
    for name in files:  # what arrived is byte for byte what lies in output_dir
        assert (remote / name).read_bytes() == (out / name).read_bytes(), name
    card = (remote / "README.md").read_text()
    # the model card's YAML header (create_model_card quotes its strings: the same value to any YAML reader)
    assert card.startswith("---\n") and re.search(r'^license: "?apache-2.0"?$', card, re.M) and "# tiny-regression" in card


def test_every_save_failure_is_logged_and_retried_at_the_next_save(tmp_path):
    out = tmp_path / "out"
    # all_checkpoints: output_dir with every checkpoint-N folder; the first commit fails (HTTP 500)
    options = {"args": {"max_steps": 6, "save_strategy": "steps", "save_steps": 2, "push_to_hub": True,
                        "hub_model_id": "me/retry", "hub_strategy": "all_checkpoints",
                        "async_save": False},  # on_save (the push) at its save step: the pauses below time it
               "pause_before": {"3": 1.0, "5": 1.0}}  # each push ends before the next save
    with HubServer(tmp_path / "hub", fail_commits=1) as hub:
        result, stderr = run_worker("train", out, options, HF_ENDPOINT=hub.url)
    assert "error" not in result, result  # training was never interrupted
    assert sorted(map(int, result["steps"])) == [1, 2, 3, 4, 5, 6]
    assert [(c["failed"], c.get("message")) for c in hub.commits] == [
        (True, None), (False, "Training in progress, step 4"), (False, "Training in progress, step 6")]
    assert "did not complete" in stderr and "next save pushes them again" in stderr
    remote = tmp_path / "hub" / "me" / "retry" / "main"
    # the failed push's checkpoint-2 arrived with the next push; every file equals the local one
    for step in (2, 4, 6):
        for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
            path = Path(f"checkpoint-{step}") / name
            assert (remote / path).read_bytes() == (out / path).read_bytes(), path
    assert (remote / "model.safetensors").read_bytes() == (out / "checkpoint-6" / "model.safetensors").read_bytes()


def test_checkpoint_strategy_pushes_in_the_background_to_the_revision(tmp_path):
    out = tmp_path / "out"
    delay = 1.0  # every commit takes a second on this Hub
    options = {"args": {"max_steps": 8, "save_strategy": "steps", "save_steps": 4, "push_to_hub": True,
                        "hub_model_id": "me/bg", "hub_strategy": "checkpoint", "hub_revision": "dev",
                        "hub_always_push": True}}
    with HubServer(tmp_path / "hub", commit_delay=delay) as hub:
        result, _ = run_worker("train", out, options, HF_ENDPOINT=hub.url)
    assert "error" not in result, result
    assert hub.branches == [("me/bg", "dev")]
    assert [(c["revision"], c["message"]) for c in hub.commits] == [
        ("dev", "Training in progress, step 4"), ("dev", "Training in progress, step 4, checkpoint"),
        ("dev", "Training in progress, step 8"), ("dev", "Training in progress, step 8, checkpoint")]
    # steps 5..8 ran while the step-4 pushes (2 s of commits) were in flight: training never waited for them
    assert result["steps"]["8"] - result["saves"]["4"] < delay
    # train() returned only once the last push had landed (it waits at the end)
    assert hub.commits[-1]["time"] <= result["train_end"]
    remote = tmp_path / "hub" / "me" / "bg" / "dev"
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth"):
        assert (remote / "last-checkpoint" / name).read_bytes() == (out / "checkpoint-8" / name).read_bytes(), name
    assert (remote / "model.safetensors").read_bytes() == (out / "checkpoint-8" / "model.safetensors").read_bytes()
    assert not (remote / "optimizer.pt").exists()  # resume state only under last-checkpoint/
