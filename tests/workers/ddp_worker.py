"""Run by test_ddp.py under torchrun: train and write the final weights and logged losses."""

import sys

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
from dist_exit import finish  # noqa: E402
from tiny import Stream, TokenDataset, TokenTagger, TokenTaggerWithItems, pad_collate  # noqa: E402

from cadence import Trainer, TrainingArguments  # noqa: E402


# how the data is given: a shuffled map-style set, grouped by length, or a stream
DATA = {
    "random": lambda: (TokenDataset(40), {}),
    "grouped": lambda: (TokenDataset(40), {"group_by_length": True}),
    "stream": lambda: (Stream(TokenDataset(40)), {"max_steps": 5}),
    # use_cpu left at its default on a machine without a GPU (accelerate alone sets up no distributed state there)
    "default_device": lambda: (TokenDataset(40), {"use_cpu": False}),
}


def main(model_name: str, out_file: str, batch: int, ga: int, data: str = "random") -> None:
    torch.set_num_threads(1)
    model_cls = {"plain": TokenTagger, "items": TokenTaggerWithItems}[model_name]
    model = model_cls(dtype=torch.float64)
    dataset, extra = DATA[data]()
    args = TrainingArguments(
        output_dir=out_file + ".d", per_device_train_batch_size=batch, gradient_accumulation_steps=ga,
        num_train_epochs=2, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant", logging_steps=1,
        save_strategy="no", disable_tqdm=True, seed=7, **{"use_cpu": True, **extra},
    )
    trainer = Trainer(model, args, train_dataset=dataset, data_collator=pad_collate)
    trainer.train()
    if args.process_index == 0:
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        torch.save({"weights": model.state_dict(), "losses": losses}, out_file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:])
    finish()
