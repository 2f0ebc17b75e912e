"""Trains and pushes in a process of its own: huggingface_hub reads HF_ENDPOINT / HF_HUB_OFFLINE /
HF_HUB_DISABLE_XET when it is imported, so each test sets them in this process's environment.

Usage: hub_worker.py MODE OUTPUT_DIR JSON; prints one JSON line of results.
  init:  build a Trainer with push_to_hub=True (the repository is created then); report an error and its time
  train: train with the JSON's TrainingArguments; then trainer.push_to_hub(**JSON["push"]) if given
"""

import json
import sys
import time

from cadence import Trainer, TrainerCallback, TrainingArguments
from tiny import RegressionDataset, RegressionModel


class Clock(TrainerCallback):
    """When each save and each step end happened; sleeps before chosen steps (lets a push finish first)."""

    def __init__(self, pause_before: dict):
        self.saves, self.steps, self.pause_before = {}, {}, pause_before

    def on_step_begin(self, args, state, control, **kwargs):
        time.sleep(self.pause_before.get(str(state.global_step + 1), 0))

    def on_step_end(self, args, state, control, **kwargs):
        self.steps[state.global_step] = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        self.saves[state.global_step] = time.perf_counter()


def main(mode: str, output_dir: str, options: dict) -> dict:
    args = TrainingArguments(output_dir, per_device_train_batch_size=8, disable_tqdm=True, logging_strategy="no",
                             **options.get("args", {}))
    clock = Clock(options.get("pause_before", {}))
    start = time.perf_counter()
    try:
        trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64), callbacks=[clock])
        if mode == "init":
            return {"seconds": time.perf_counter() - start}
        trainer.train()
        trained = time.perf_counter()
        result = {"saves": clock.saves, "steps": clock.steps, "train_seconds": trained - start, "train_end": time.time()}
        if "push" in options:
            start = time.perf_counter()
            result["commit"] = str(trainer.push_to_hub(**options["push"]))
            result["push_seconds"] = time.perf_counter() - start
        return result
    except Exception as error:  # noqa: BLE001 - reported to the test
        # seconds: since the Trainer was built (init) or the push began (train)
        return {"error_type": type(error).__name__, "error": str(error), "seconds": time.perf_counter() - start}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))))
