"""Run by test_gather_object.py (under torchrun for 2 processes): a model whose outputs include one string per
row; evaluate and predict with eval_use_gather_object on and off, write what process 0 got."""

import sys

import torch
from torch import nn

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
from dist_exit import finish_at_exit  # noqa: E402
from tiny import RegressionDataset  # noqa: E402

from cadence import Trainer, TrainingArguments  # noqa: E402


class Words(nn.Module):
    """y = a*x + b, and each row's input written out as a string (a non-tensor output, one per row)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Parameter(torch.tensor(1.5, dtype=torch.float64)), nn.Parameter(torch.tensor(0.5, dtype=torch.float64))

    def forward(self, input_x, labels=None):
        y = self.a * input_x.double() + self.b
        out = {"logits": y, "words": [f"x={v:.6f}" for v in input_x.tolist()]}
        if labels is not None:
            out = {"loss": nn.functional.mse_loss(y, labels.double()), **out}
        return out


def metrics(p):
    values, words = p.predictions
    return {"rows": len(words), "words_match": float(all(w == f"x={x:.6f}" for w, x in zip(words, (values - 0.5) / 1.5)))}


def main(out_file: str) -> None:
    torch.set_num_threads(1)
    finish_at_exit()
    ds = RegressionDataset(19)  # batches of 3: 7 batches, so with 2 processes process 1 runs a padding batch
    results = {}
    for flag in (False, True):
        args = TrainingArguments(output_dir=out_file + ".d", per_device_eval_batch_size=3, disable_tqdm=True,
                                 use_cpu=True, report_to="none", eval_use_gather_object=flag)
        trainer = Trainer(Words(), args, compute_metrics=metrics)
        evaluated = trainer.evaluate(ds)
        predicted = trainer.predict(ds)
        values, words = predicted.predictions
        results[flag] = {"eval": {k: v for k, v in evaluated.items() if k in ("eval_rows", "eval_words_match", "eval_loss")},
                         "values": torch.from_numpy(values), "words": words, "labels": torch.from_numpy(predicted.label_ids)}
    if args.process_index == 0:
        torch.save(results, out_file)


if __name__ == "__main__":
    main(sys.argv[1])
