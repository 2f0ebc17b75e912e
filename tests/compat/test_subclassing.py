"""The subclassing contract (docs/subclassing.md; its examples run in tests/docs/test_docs.py): ``trainer.accelerator``
answers accelerate's methods on one process (on two: tests/examples/test_qa_example.py); the attributes transformers' subclasses
read exist with transformers' meaning."""

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

import cadence
from cadence import Trainer, TrainingArguments
from tiny import RegressionDataset, RegressionModel
from repo_paths import REPO, find_test_file

DOC = Path(REPO) / "docs" / "subclassing.md"


def args(out, **kw):
    return TrainingArguments(str(out), **{"max_steps": 4, "per_device_train_batch_size": 8, "learning_rate": 0.1,
                                          "report_to": "none", "use_cpu": True, "save_strategy": "no",
                                          "disable_tqdm": True, **kw})


def test_accelerator_view_on_one_process(tmp_path):
    trainer = Trainer(RegressionModel(), args(tmp_path, bf16=True), train_dataset=RegressionDataset(16))
    acc = trainer.accelerator
    assert (acc.num_processes, acc.process_index, acc.local_process_index) == (1, 0, 0)
    assert acc.is_main_process and acc.is_local_main_process and acc.is_last_process and not acc.use_distributed
    assert acc.device == trainer.args.device and acc.mixed_precision == "bf16"
    from accelerate.utils import DistributedType
    assert acc.distributed_type == DistributedType.NO
    t = torch.arange(6.0).reshape(2, 3)
    assert acc.gather(t) is t and acc.gather_for_metrics(t) is t and acc.pad_across_processes(t, dim=1) is t
    reduced = acc.reduce({"x": t}, reduction="mean")
    assert torch.equal(reduced["x"], t) and reduced["x"] is not t  # a copy, as accelerate returns
    assert acc.unwrap_model(trainer.model) is trainer.model
    with acc.autocast():  # cadence's forward context: bf16 autocast here
        assert (trainer.model.a * torch.ones(2, 2)).dtype == torch.float32 and torch.is_autocast_enabled("cpu")
    loss = (trainer.model.a - 1.0) ** 2
    acc.backward(loss)
    assert trainer.model.a.grad.item() == pytest.approx(-2.0)
    acc.wait_for_everyone()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        acc.print("hello")
    assert printed.getvalue() == "hello\n"
    assert acc.split_between_processes([1, 2, 3]).__enter__() == [1, 2, 3]  # accelerate's PartialState answers
    with pytest.raises(AttributeError, match="trainer.accelerator has no attribute 'no_such_method'"):
        acc.no_such_method


def test_subclass_using_the_accelerator_trains_like_the_plain_trainer(tmp_path):
    class Gathering(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            self.gathered = getattr(self, "gathered", 0) + self.accelerator.gather(inputs["labels"]).numel()
            outputs = self.accelerator.unwrap_model(model)(**inputs)
            return (outputs[0], outputs) if return_outputs else outputs[0]

    plain = Trainer(RegressionModel(), args(tmp_path / "a", gradient_accumulation_steps=2), train_dataset=RegressionDataset())
    plain.train()
    sub = Gathering(RegressionModel(), args(tmp_path / "b", gradient_accumulation_steps=2), train_dataset=RegressionDataset())
    sub.train()
    assert sub.gathered == 4 * 2 * 8
    assert sub.model.a.item() == plain.model.a.item() and sub.model.b.item() == plain.model.b.item()


def test_attributes_subclasses_read(tmp_path):
    trainer = Trainer(RegressionModel(), args(tmp_path), train_dataset=RegressionDataset(16))
    assert trainer.is_fsdp_enabled is False and trainer.is_deepspeed_enabled is False
    assert trainer.model_wrapped is trainer.model and trainer.is_in_train is False
    assert trainer.callback_handler.on_evaluate(trainer.args, trainer.state, trainer.control, metrics={}) is trainer.control
    trainer.compute_metrics = lambda p: {"n": 1.0}  # settable
    assert trainer.compute_metrics(None) == {"n": 1.0}


def test_question_answering_label_names_like_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16)
    model = transformers.BertForQuestionAnswering(config)
    from transformers.utils import find_labels

    expected = find_labels(type(model))
    assert expected == ["start_positions", "end_positions"]
    assert Trainer(model, args(tmp_path)).label_names == expected
    assert cadence.Trainer(transformers.BertForSequenceClassification(config), args(tmp_path)).label_names == ["labels"]


def test_the_audit_table_covers_every_transformers_trainer_method():
    """docs/subclassing.md's audit lists every method of transformers' Trainer once; a method marked same, thin wrapper
    or refused exists on cadence's Trainer, one marked not applicable does not (nothing pretends to call its
    override), and every test a row names exists."""
    transformers = pytest.importorskip("transformers")
    text = DOC.read_text()
    audit = text[text.index("## The audit"):]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|[^|]*\| ([^|]*) \|$", audit, flags=re.M)
    listed = [name for name, _, _ in rows]
    theirs = sorted(n for n in dir(transformers.Trainer) if not (n.startswith("__") and n.endswith("__")))
    assert sorted(listed) == theirs  # each once, none missing
    for name, status, tests in rows:
        status = status.strip()
        if status in ("same", "thin wrapper", "refused"):
            assert hasattr(cadence.Trainer, name), name
        elif status == "not applicable":
            assert not hasattr(cadence.Trainer, name), name
        for file, _, test in re.findall(r"(test_\w+\.py)(::(\w+))?", tests):
            source = Path(find_test_file(file))
            assert source.exists(), (name, file)
            if test:
                assert f"def {test}(" in source.read_text(), (name, test)
    refused = [name for name, status, _ in rows if status.strip() == "refused"]
    assert sorted(refused) == sorted(cadence.Trainer._NOT_CALLED_BY_CADENCE)
