"""Run by test_hyperparameter_search.py under torchrun: an optuna search with pruning on two processes.

Every process writes, per trial it trained, the values its own arguments held and the steps it trained,
so the test can check that both processes ran the same trials with the same values and stopped together.
"""

import json
import sys

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
from dist_exit import finish_at_exit  # noqa: E402  (and a worker that aborts prints its Python stacks)
from tiny import RegressionDataset, RegressionModel  # noqa: E402

from cadence import Trainer, TrainerCallback, TrainingArguments  # noqa: E402


class Record(TrainerCallback):
    def __init__(self):
        self.trials = []

    def on_train_end(self, args, state, control, **kwargs):
        self.trials.append({"output_dir": args.output_dir, "learning_rate": args.learning_rate, "seed": args.seed,
                            "steps": state.global_step, "trial_params": state.trial_params})


def main(out_file: str) -> None:
    import optuna

    torch.set_num_threads(1)
    finish_at_exit()  # cadence ends the process group it started; the test checks it did, and no teardown abort
    args = TrainingArguments(out_file + ".d", per_device_train_batch_size=4, num_train_epochs=3, eval_strategy="steps",
                             eval_steps=2, save_strategy="no", logging_strategy="no", disable_tqdm=True, use_cpu=True)
    record = Record()
    trainer = Trainer(args=args, model_init=lambda: RegressionModel(), train_dataset=RegressionDataset(64),
                      eval_dataset=RegressionDataset(32, seed=7), callbacks=[record])

    def space(trial):  # process 0 samples; the others must receive these values
        return {"learning_rate": trial.suggest_categorical("learning_rate", [0.3, 1e-5]),
                "seed": trial.suggest_int("seed", 1, 40)}

    best = trainer.hyperparameter_search(hp_space=space, n_trials=4, backend="optuna",
                                         sampler=optuna.samplers.RandomSampler(seed=args.process_index),
                                         pruner=optuna.pruners.ThresholdPruner(upper=8.0, n_warmup_steps=4))
    result = {"trials": record.trials, "best": None if best is None else list(best[:3])}
    with open(f"{out_file}.{args.process_index}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
