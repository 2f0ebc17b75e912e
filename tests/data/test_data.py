"""Dataloaders, collators, column removal, samplers and bad input, against transformers as reference."""

import logging

import numpy as np
import pytest
import torch
from tiny import ClassifierModel, args_with, word_tokenizer

from cadence import Trainer
from cadence.data import DataCollatorWithPadding, DefaultDataCollator, default_data_collator

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")


make_args = args_with(use_cpu=True)


def assert_same_batch(ours, theirs):
    assert set(ours) == set(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype, key
        assert torch.equal(ours[key], theirs[key]), key


def text_rows(n=10, seed=0):
    """Rows of a classification set: text of 2..9 words, an int label, and an extra 'idx' column."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        words = " ".join(f"w{w}" for w in rng.integers(0, 30, rng.integers(2, 10)))
        rows.append({"text": words, "label": int(rng.integers(0, 3)), "idx": i})
    return rows


def tokenized(rows, tokenizer):
    return [{**r, **tokenizer(r["text"])} for r in rows]


# ---------------------------------------------------------------------------------- default collator
@pytest.mark.parametrize(
    "features",
    [
        [{"x": [1, 2], "label": 0}, {"x": [3, 4], "label": 2}],
        [{"x": 1.5, "label": 0.5}, {"x": 2.5, "label": 1.0}],
        [{"x": np.ones(3, dtype=np.float32), "label_ids": [1, 2]}, {"x": np.zeros(3, dtype=np.float32), "label_ids": [3, 4]}],
        [{"x": torch.arange(3), "label_ids": torch.tensor([1.0, 2.0])}, {"x": torch.arange(3, 6), "label_ids": torch.tensor([3.0, 4.0])}],
        [{"x": torch.tensor(1), "label": torch.tensor(1), "text": "a", "skip": None}, {"x": torch.tensor(2), "label": torch.tensor(0), "text": "b", "skip": None}],
        [{"input_ids": [1, 2, 3], "labels": [1, -100, 3]}, {"input_ids": [4, 5, 6], "labels": [4, 5, -100]}],
    ],
)
def test_default_collator_matches_transformers(features):
    theirs = transformers.default_data_collator(features)
    assert_same_batch(default_data_collator(features), theirs)
    assert_same_batch(DefaultDataCollator()(features), theirs)


def test_default_collator_reads_dataclass_samples():
    import dataclasses

    @dataclasses.dataclass
    class Features:
        input_ids: list
        label: int

    features = [Features([1, 2], 1), Features([3, 4], 0)]
    assert_same_batch(default_data_collator(features), transformers.default_data_collator(features))


def test_default_collator_tuples_go_through_default_collate():
    batch = default_data_collator([(torch.tensor([1.0]), 0), (torch.tensor([2.0]), 1)])
    assert torch.equal(batch[0], torch.tensor([[1.0], [2.0]])) and torch.equal(batch[1], torch.tensor([0, 1]))


# ---------------------------------------------------------------------------------- padding collator
def test_padding_collator_shapes_and_pad_values():
    collate = DataCollatorWithPadding(pad_token_id=7, pad_to_multiple_of=4)
    batch = collate([
        {"input_ids": [1, 2, 3, 4, 5], "attention_mask": [1] * 5, "labels": [1, 2, 3, 4, 5], "label_cls": 2},
        {"input_ids": [6, 7], "attention_mask": [1, 1], "labels": [6, -100], "label_cls": 0},
    ])
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 7, 7, 7], [6, 7, 7, 7, 7, 7, 7, 7]]
    assert batch["attention_mask"].tolist() == [[1] * 5 + [0] * 3, [1, 1] + [0] * 6]
    assert batch["labels"].tolist() == [[1, 2, 3, 4, 5, -100, -100, -100], [6, -100] + [-100] * 6]
    assert batch["label_cls"].tolist() == [2, 0]
    assert DataCollatorWithPadding(pad_token_id=0)([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])["input_ids"].shape == (2, 3)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("multiple", [None, 8])
def test_padding_collator_matches_transformers_with_a_tokenizer(side, multiple):
    tokenizer = word_tokenizer(side)
    features = [{k: v for k, v in r.items() if k != "text"} for r in tokenized(text_rows(5), tokenizer)]
    features = [{k: v for k, v in f.items() if k not in ("attention_mask",)} for f in features]  # the mask is made
    theirs = transformers.DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple)(features)
    ours = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple)(features)
    assert_same_batch(ours, dict(theirs))
    assert ours["attention_mask"].sum().item() == sum(len(f["input_ids"]) for f in features)


def test_padding_collator_without_pad_id_is_a_clear_error():
    with pytest.raises(ValueError, match="pad_token_id"):
        DataCollatorWithPadding()


def test_default_collator_is_chosen_as_transformers_does(out_dir):
    tokenizer = word_tokenizer()
    assert isinstance(Trainer(ClassifierModel(), make_args(out_dir), processing_class=tokenizer).data_collator,
                      DataCollatorWithPadding)
    assert Trainer(ClassifierModel(), make_args(out_dir)).data_collator is default_data_collator


@pytest.mark.parametrize("collator", ["padding", "lm"])
def test_transformers_collators_work_unchanged(out_dir, collator):
    tokenizer = word_tokenizer()
    rows = [{"input_ids": r["input_ids"]} for r in tokenized(text_rows(8), tokenizer)]
    if collator == "padding":
        rows = [{**r, "labels": 1} for r in rows]
        collate = transformers.DataCollatorWithPadding(tokenizer)
    else:
        collate = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False)

    class LM(ClassifierModel):
        def forward(self, input_ids, attention_mask=None, labels=None):
            logits = self.out(self.emb(input_ids)) if collator == "lm" else super().forward(input_ids, attention_mask)["logits"]
            flat = logits.flatten(0, -2)
            return {"loss": torch.nn.functional.cross_entropy(flat, labels.flatten(), ignore_index=-100)}

    trainer = Trainer(LM(classes=32), make_args(out_dir, max_steps=2, per_device_train_batch_size=4),
                      train_dataset=rows, data_collator=collate)
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].shape[0] == 4 and "attention_mask" in batch
    assert trainer.train().global_step == 2


# ---------------------------------------------------------------------------------- column removal
def test_dict_dataset_columns_removed_in_collator_with_log(out_dir, caplog):
    tokenizer = word_tokenizer()
    rows = tokenized(text_rows(6), tokenizer)
    trainer = Trainer(ClassifierModel(), make_args(out_dir, per_device_train_batch_size=3), train_dataset=rows,
                      processing_class=tokenizer)
    with caplog.at_level(logging.INFO, logger="cadence"):
        batch = next(iter(trainer.get_train_dataloader()))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert "have been ignored: text, idx." in caplog.text


def test_hf_dataset_columns_removed_with_column_api(out_dir, caplog):
    tokenizer = word_tokenizer()
    ds = datasets.Dataset.from_list(tokenized(text_rows(6), tokenizer))
    trainer = Trainer(ClassifierModel(), make_args(out_dir, per_device_train_batch_size=3), train_dataset=ds,
                      processing_class=tokenizer)
    with caplog.at_level(logging.INFO, logger="cadence"):
        loader = trainer.get_train_dataloader()
    assert loader.dataset.column_names == ["label", "input_ids", "attention_mask"]
    assert ds.column_names == ["text", "label", "idx", "input_ids", "attention_mask"]  # the user's dataset is untouched
    assert ("The following columns in the Training set don't have a corresponding argument in "
            "`ClassifierModel.forward` and have been ignored: text, idx." in caplog.text)
    assert set(next(iter(loader))) == {"input_ids", "attention_mask", "labels"}


def test_label_columns_and_label_names_are_kept(out_dir):
    rows = [{"input_ids": [1, 2], "label": 1, "my_target": 0.5} for _ in range(4)]
    trainer = Trainer(ClassifierModel(), make_args(out_dir, label_names=["my_target"]), train_dataset=rows)
    assert set(next(iter(trainer.get_train_dataloader()))) == {"input_ids", "labels", "my_target"}


class PeftLike(torch.nn.Module):
    """forward(*args, **kwargs) over base_model.model, as peft's PeftModel is built."""

    def __init__(self, model):
        super().__init__()
        self.base_model = torch.nn.Module()
        self.base_model.model = model

    def forward(self, *args, **kwargs):
        return self.base_model.model(*args, **kwargs)


def test_wrapped_model_columns_looked_up_through_the_wrapper(out_dir):
    tokenizer = word_tokenizer()
    rows = tokenized(text_rows(6), tokenizer)
    trainer = Trainer(PeftLike(ClassifierModel()), make_args(out_dir, max_steps=2, per_device_train_batch_size=3),
                      train_dataset=rows, processing_class=tokenizer)
    assert set(next(iter(trainer.get_train_dataloader()))) == {"input_ids", "attention_mask", "labels"}
    assert trainer.train().global_step == 2


@pytest.mark.parametrize("kind", ["dict", "hf"])
def test_nothing_left_is_an_error_naming_both_sides(out_dir, kind):
    rows = [{"ids": [1, 2], "target": 1}] * 4
    ds = rows if kind == "dict" else datasets.Dataset.from_list(rows)
    trainer = Trainer(ClassifierModel(), make_args(out_dir), train_dataset=ds)
    with pytest.raises(ValueError, match=r"dataset has \['ids', 'target'\], the model accepts \['attention_mask', "
                                         r"'input_ids', 'label', 'label_ids', 'labels'\].*remove_unused_columns=False"):
        next(iter(trainer.get_train_dataloader()))  # a dict dataset: at its first batch (never read early)


# ---------------------------------------------------------------------------------- parity with transformers
def test_train_batches_equal_transformers_get_train_dataloader(tmp_path):
    tokenizer = word_tokenizer()
    ds = datasets.Dataset.from_list(tokenized(text_rows(22), tokenizer))
    loaders = {}
    for lib in (transformers, __import__("cadence")):
        args = make_args(str(tmp_path / lib.__name__), lib, per_device_train_batch_size=4, seed=7)
        trainer = lib.Trainer(ClassifierModel(), args, train_dataset=ds, processing_class=tokenizer)
        loaders[lib.__name__] = list(trainer.get_train_dataloader())
    theirs, ours = loaders["transformers"], loaders["cadence"]
    assert len(theirs) == len(ours) == 6
    for t, o in zip(theirs, ours):
        assert_same_batch(o, dict(t))


# ---------------------------------------------------------------------------------- bad input
class Rows(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def first_step_error(out_dir, rows, **kw):
    trainer = Trainer(ClassifierModel(), make_args(out_dir, max_steps=1, per_device_train_batch_size=4,
                                                   train_sampling_strategy="sequential", **kw), train_dataset=Rows(rows))
    with pytest.raises(ValueError) as error:
        trainer.train()
    assert trainer.state.global_step == 0
    return str(error.value)


def test_inconsistent_keys_name_the_sample(out_dir):
    rows = [{"input_ids": [1, 2], "labels": 0}] * 4
    rows[2] = {"input_ids": [1, 2]}
    assert "sample 2 of the batch has different keys from sample 0 (missing ['labels'], extra [])" in first_step_error(out_dir, rows)


def test_inconsistent_shapes_name_field_and_sample(out_dir):
    rows = [{"input_ids": [1, 2], "labels": 0}] * 4
    rows[3] = {"input_ids": [1, 2, 3], "labels": 0}
    message = first_step_error(out_dir, rows)
    assert "field 'input_ids': sample 3 of the batch has shape (3,) but sample 0 has (2,)" in message
    assert "DataCollatorWithPadding" in message


def test_text_in_a_tensor_field_names_field_and_sample(out_dir):
    rows = [{"input_ids": [1, 2], "labels": 0}] * 4
    rows[1] = {"input_ids": ["w1", "w2"], "labels": 0}
    assert "field 'input_ids' of sample 1 of the batch holds text" in first_step_error(out_dir, rows)


@pytest.mark.parametrize("kind", ["dict", "hf"])
def test_untokenized_text_input_is_refused_before_the_first_step(out_dir, kind):
    rows = [{"input_ids": "w1 w2", "labels": 0}] * 4
    ds = Rows(rows) if kind == "dict" else datasets.Dataset.from_list(rows)
    trainer = Trainer(ClassifierModel(), make_args(out_dir, max_steps=1), train_dataset=ds)
    with pytest.raises(ValueError, match="field 'input_ids' of the training dataset holds text.*tokenize"):
        next(iter(trainer.get_train_dataloader()))  # at the first batch: a dataset is never read early


GOOD_ROW = {"input_ids": [1, 2], "labels": 0}


@pytest.mark.parametrize("rows,culprits", [
    ([None] * 8, ("train_dataset row 0 is None", "a dict of inputs")),
    ([GOOD_ROW, GOOD_ROW, None, *[GOOD_ROW] * 5], ("train_dataset row 2 is None", "a dict of inputs")),
    ([None, *[GOOD_ROW] * 7], ("train_dataset row 0 is None",)),
    (["w1 w2"] * 8, ("train_dataset row 0 is a str ('w1 w2')", "tokenize")),
    ([GOOD_ROW, "w1 w2", *[GOOD_ROW] * 6], ("train_dataset row 1 is a str", "tokenize")),
], ids=["all-none", "one-none", "none-first", "strings", "one-string"])
def test_rows_that_are_none_or_text_are_named_before_the_first_step(out_dir, rows, culprits):
    """torch's collate ("found <class 'NoneType'>"), an AttributeError, or the model's forward ("takes 2 positional
    arguments but 5 were given") before: now the dataset, the row and what a row must be."""
    message = first_step_error(out_dir, rows)
    for culprit in culprits:
        assert culprit in message, message


def test_a_none_row_of_the_eval_dataset_is_named(out_dir):
    trainer = Trainer(ClassifierModel(), make_args(out_dir, max_steps=1, per_device_eval_batch_size=4),
                      train_dataset=Rows([GOOD_ROW] * 4), eval_dataset=Rows([GOOD_ROW] * 5 + [None]))
    with pytest.raises(ValueError, match=r"eval_dataset row 5 is None"):
        trainer.evaluate()
    with pytest.raises(ValueError, match=r"test_dataset row 5 is None"):
        trainer.predict(Rows([GOOD_ROW] * 5 + [None]))


def test_collators_name_a_bad_sample_of_the_batch():
    for collate in (default_data_collator, DataCollatorWithPadding(pad_token_id=0)):
        with pytest.raises(ValueError, match=r"sample 1 of the batch is None"):
            collate([GOOD_ROW, None])
        with pytest.raises(ValueError, match=r"sample 0 of the batch is a str"):
            collate(["w1 w2", "w3"])


def test_rows_that_are_not_dicts_still_train_with_their_own_collator(out_dir):
    """Tuples through the default collator, strings with a tokenizing collator, tensors with a collator that
    names them: what the default collator can take, or what a custom collator turns into a batch, still trains."""
    tokenizer = word_tokenizer()

    def tokenize(texts):
        batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
        batch["labels"] = torch.tensor([len(t.split()) % 3 for t in texts])
        return batch

    texts = ["w1 w2", "w3 w4 w5", "w6", "w7 w8"] * 2
    trainer = Trainer(ClassifierModel(), make_args(out_dir, max_steps=2, per_device_train_batch_size=4),
                      train_dataset=Rows(texts), data_collator=tokenize)
    assert trainer.train().global_step == 2

    class TupleModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def forward(self, x, y):
            return (torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), y),)

    pairs = [(torch.tensor([float(i), 1.0]), torch.tensor(float(i))) for i in range(8)]
    trainer = Trainer(TupleModel(), make_args(out_dir, max_steps=2, per_device_train_batch_size=4), train_dataset=Rows(pairs))
    assert trainer.train().global_step == 2
    tensors = [torch.tensor([float(i), 1.0]) for i in range(8)]
    trainer = Trainer(TupleModel(), make_args(out_dir, max_steps=2, per_device_train_batch_size=4), train_dataset=Rows(tensors),
                      data_collator=lambda rows: {"x": torch.stack(rows), "y": torch.stack(rows)[:, 0]})
    assert trainer.train().global_step == 2


def test_a_collator_that_returns_rows_uncollated_is_named(out_dir):
    """A collator returning the rows as they are (a list of strings) reached forward(*rows): "takes 2 positional
    arguments but 5 were given"."""
    trainer = Trainer(ClassifierModel(), make_args(out_dir, max_steps=1, per_device_train_batch_size=4,
                                                   train_sampling_strategy="sequential"),
                      train_dataset=Rows(["w1 w2"] * 4), data_collator=lambda rows: rows)
    with pytest.raises(TypeError, match=r"data_collator returned a list of 4 str.*not collated"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_batch_larger_than_dataset_with_drop_last(out_dir):
    rows = [{"input_ids": [1, 2], "labels": 0}] * 3
    message = first_step_error(out_dir, rows, dataloader_drop_last=True)
    assert "3 samples with per_device_train_batch_size=4 and dataloader_drop_last=True" in message


@pytest.mark.parametrize("kind", ["dict", "hf"])
def test_empty_dataset_is_refused_at_init(out_dir, kind):
    ds = Rows([]) if kind == "dict" else datasets.Dataset.from_list([])
    with pytest.raises(ValueError, match="train_dataset is empty"):
        Trainer(ClassifierModel(), make_args(out_dir), train_dataset=ds)


# ---------------------------------------------------------------------------------- length-grouped sampler
from cadence.data import EpochSampler, LengthGroupedSampler, length_grouped_indices  # noqa: E402


def padded_tokens(order, lengths, batch):
    """Padding positions when the samples are batched in this order and padded to each batch's longest."""
    pads = 0
    for i in range(0, len(order), batch):
        chunk = [lengths[j] for j in order[i : i + batch]]
        pads += max(chunk) * len(chunk) - sum(chunk)
    return pads


def varied_lengths(n=400, seed=0):
    return torch.randint(1, 129, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("n, batch, seed", [(400, 8, 0), (37, 4, 3), (10, 16, 1), (64, 2, 5)])
def test_length_grouped_indices_equal_transformers(n, batch, seed):
    from transformers.trainer_pt_utils import get_length_grouped_indices

    lengths = torch.randint(1, 20, (n,), generator=torch.Generator().manual_seed(seed)).tolist()  # many ties
    theirs = get_length_grouped_indices(lengths, batch, generator=torch.Generator().manual_seed(seed))
    assert length_grouped_indices(lengths, batch, generator=torch.Generator().manual_seed(seed)) == theirs


def test_sampler_order_is_transformers_order_seeded_by_seed_plus_epoch():
    from transformers.trainer_pt_utils import LengthGroupedSampler as HFSampler

    lengths = varied_lengths(100)
    ours = LengthGroupedSampler(8, lengths=lengths, seed=42)
    for epoch in (0, 1):
        ours.set_epoch(epoch)
        theirs = HFSampler(8, lengths=lengths, generator=torch.Generator().manual_seed(42 + epoch))
        assert list(ours) == list(theirs)
    # HF's own way, one generator drawn from every epoch, is accepted too
    generator_run = LengthGroupedSampler(8, lengths=lengths, generator=torch.Generator().manual_seed(1))
    assert list(generator_run) == list(HFSampler(8, lengths=lengths, generator=torch.Generator().manual_seed(1)))


def test_group_by_length_cuts_padding_and_is_deterministic():
    lengths, batch = varied_lengths(400), 8
    grouped = LengthGroupedSampler(batch, lengths=lengths, seed=0)
    random_order = list(EpochSampler(len(lengths), shuffle=True, seed=0))
    ratio = padded_tokens(list(grouped), lengths, batch) / padded_tokens(random_order, lengths, batch)
    assert ratio < 0.15  # measured 0.108: 21,076 padding tokens in random order, 2,268 grouped
    assert sorted(grouped) == list(range(400))
    assert lengths[next(iter(grouped))] == max(lengths)  # the longest batch comes first
    again = LengthGroupedSampler(batch, lengths=lengths, seed=0)
    assert list(again) == list(grouped)
    again.set_epoch(1)
    assert list(again) != list(grouped)


def test_group_by_length_shards_the_one_process_order():
    lengths = varied_lengths(101)
    one = list(LengthGroupedSampler(12, lengths=lengths, seed=3))
    shards = [list(LengthGroupedSampler(12, lengths=lengths, seed=3, rank=r, world_size=2)) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == 51  # padded by wrapping so no process waits
    assert [i for pair in zip(*shards) for i in pair][:101] == one
    # each global step's 2 x 6 samples are the 12 of one-process step (a slice of a sorted megabatch)
    for step in range(8):
        assert sorted(shards[0][6 * step : 6 * step + 6] + shards[1][6 * step : 6 * step + 6]) == sorted(one[12 * step : 12 * step + 12])


def test_trainer_group_by_length(out_dir):
    from tiny import TokenDataset, TokenTagger, pad_collate

    args = make_args(out_dir, group_by_length=True, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                     num_train_epochs=2, seed=5)
    trainer = Trainer(TokenTagger(), args, train_dataset=TokenDataset(40), data_collator=pad_collate)
    loader = trainer.get_train_dataloader()
    assert isinstance(loader.sampler, LengthGroupedSampler) and loader.sampler.batch_size == 8
    lengths = [len(r[0]) for r in TokenDataset(40).rows]
    assert loader.sampler.lengths == lengths
    assert list(loader.sampler) == length_grouped_indices(lengths, 8, generator=torch.Generator().manual_seed(5))
    assert trainer.train().global_step == 10


def test_group_by_length_reads_the_length_column_of_hf_datasets(out_dir):
    rows = [{"input_ids": [1] * n, "labels": 0, "length": 100 - n} for n in range(1, 21)]  # a length column that lies
    trainer = Trainer(ClassifierModel(), make_args(out_dir, train_sampling_strategy="group_by_length",
                                                   per_device_train_batch_size=4),
                      train_dataset=datasets.Dataset.from_list(rows), data_collator=DataCollatorWithPadding(pad_token_id=0))
    loader = trainer.get_train_dataloader()
    assert loader.sampler.lengths == [100 - n for n in range(1, 21)]
    assert "length" not in loader.dataset.column_names  # removed for the model, after the sampler read it
    assert next(iter(loader))["input_ids"][0, :2].tolist() == [1, 0]  # first: the 1-token row, whose "length" is largest


def test_group_by_length_without_lengths_is_a_clear_error(out_dir):
    from tiny import RegressionDataset, RegressionModel

    trainer = Trainer(RegressionModel(), make_args(out_dir, group_by_length=True), train_dataset=RegressionDataset(8))
    with pytest.raises(ValueError, match="no 'input_ids' field and no 'length' column.*length_column_name"):
        trainer.get_train_dataloader()


def test_trainer_pt_utils_reexports():
    from cadence import loss, trainer_pt_utils

    assert trainer_pt_utils.LengthGroupedSampler is LengthGroupedSampler
    assert trainer_pt_utils.LabelSmoother is loss.LabelSmoother


# ---------------------------------------------------------------------------------- workers
class NoisyRegression(torch.utils.data.Dataset):
    """input_x with noise from python's and numpy's generators, which forked workers copy unless seeded."""

    def __init__(self, n=24, noisy=True):
        self.n, self.noisy = n, noisy

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import random

        noise = random.random() + np.random.rand() if self.noisy else 0.0
        return {"input_x": torch.tensor(float(i) + noise), "labels": torch.tensor(float(i % 5))}


def seen_batches(out_dir, workers, noisy=False, **kw):
    from tiny import RegressionModel

    seen = []

    class Recorder(RegressionModel):
        def forward(self, input_x, labels=None):
            seen.append(input_x.clone())
            return super().forward(input_x, labels)

    args = make_args(out_dir, per_device_train_batch_size=4, num_train_epochs=2, dataloader_num_workers=workers,
                     logging_steps=1, seed=11, **kw)
    trainer = Trainer(Recorder(), args, train_dataset=NoisyRegression(noisy=noisy))
    trainer.train()
    return seen, [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_same_batches_with_and_without_workers(out_dir):
    base, base_losses = seen_batches(out_dir, 0)
    with_workers, losses = seen_batches(out_dir, 2, dataloader_persistent_workers=True, dataloader_prefetch_factor=3)
    assert len(base) == len(with_workers) == 12
    for a, b in zip(base, with_workers):
        assert torch.equal(a, b)
    assert losses == base_losses
    assert [b.tolist() for b in base[:6]] != [b.tolist() for b in base[6:]]  # set_epoch reached the sampler


def test_workers_are_seeded_reproducibly(out_dir):
    first, _ = seen_batches(out_dir, 2, noisy=True)
    second, _ = seen_batches(out_dir, 2, noisy=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    noise = torch.cat(first) - torch.cat(first).floor()
    assert noise.unique().numel() == noise.numel()  # the two workers did not draw the same numbers


# ---------------------------------------------------------------------------------- iterable datasets
from cadence.data import IterableShard, TokenCounter  # noqa: E402


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


@pytest.mark.parametrize("n, drop_last", [(24, False), (21, False), (21, True)])
def test_iterable_shard_splits_each_global_batch(n, drop_last):
    shards = [list(IterableShard(Stream(n), 3, rank, 2, drop_last)) for rank in range(2)]
    assert len(shards[0]) == len(shards[1])  # same number of batches everywhere: no process waits for another
    global_batches = [shards[0][i : i + 3] + shards[1][i : i + 3] for i in range(0, len(shards[0]), 3)]
    expected = list(range(n)) if n % 6 == 0 else (list(range(18)) if drop_last else list(range(21)) + [0, 1, 2])
    assert [i for batch in global_batches for i in batch] == expected


def test_hf_iterable_dataset_trains_with_max_steps(out_dir):
    tokenizer = word_tokenizer()
    rows = tokenized(text_rows(12), tokenizer)
    stream = datasets.Dataset.from_list(rows).to_iterable_dataset(num_shards=2)
    seen = []

    class Recorder(ClassifierModel):
        def forward(self, input_ids, attention_mask=None, labels=None):
            seen.append(labels.tolist())
            return super().forward(input_ids, attention_mask, labels)

    args = make_args(out_dir, max_steps=5, per_device_train_batch_size=4)
    trainer = Trainer(Recorder(), args, train_dataset=stream, processing_class=tokenizer)
    assert trainer.train().global_step == 5
    labels = [r["label"] for r in rows]
    assert seen == [labels[0:4], labels[4:8], labels[8:12], labels[0:4], labels[4:8]]  # the stream restarts per epoch


# ---------------------------------------------------------------------------------- tokens and FLOPs
def test_token_counter_modes():
    batch = {"input_ids": torch.tensor([[5, 6, 0], [7, 0, 0]]), "attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])}
    counts = {}
    for mode in ("all", "non_padding", "no"):
        counter = TokenCounter(mode)
        counter.add(batch)
        counter.add(batch)
        counts[mode] = int(counter.total())
    assert counts == {"all": 12, "non_padding": 6, "no": 0}
    no_mask = TokenCounter("non_padding", pad_token_id=0)
    no_mask.add({"input_ids": batch["input_ids"]})
    assert int(no_mask.total()) == 3


@pytest.mark.parametrize("mode", ["all", "non_padding"])
def test_tokens_and_flos_equal_transformers(tmp_path, mode):
    from tiny import tiny_gpt2

    tokenizer = word_tokenizer()
    rows = [{"input_ids": r["input_ids"]} for r in tokenized(text_rows(16), tokenizer)]
    results = {}
    for lib in (transformers, __import__("cadence")):
        args = make_args(str(tmp_path / lib.__name__), lib, max_steps=3, per_device_train_batch_size=4,
                         gradient_accumulation_steps=2, logging_steps=1, include_num_input_tokens_seen=mode, seed=3)
        trainer = lib.Trainer(tiny_gpt2(), args, train_dataset=rows, processing_class=tokenizer,
                              data_collator=transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False))
        out = trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h]
        results[lib.__name__] = ([h["num_input_tokens_seen"] for h in logs], trainer.state.total_flos, logs, out.metrics)
    theirs, ours = results["transformers"], results["cadence"]
    assert ours[0] == theirs[0] and ours[0][-1] > 0
    assert ours[1] == pytest.approx(theirs[1], rel=1e-12) and ours[1] > 0
    assert all(h["train_tokens_per_second"] > 0 for h in ours[2])
    assert ours[3]["total_flos"] == ours[1] and ours[3]["train_tokens_per_second"] > 0
    lengths = sorted(len(r["input_ids"]) for r in rows)
    if mode == "non_padding":  # 3 steps x 8 samples cover the 16 rows once and 8 of them again
        assert sum(lengths) < ours[0][-1] < sum(lengths) + sum(lengths[-8:]) + 1


def test_tokens_and_flos_count_the_batch_a_training_step_rewrote(tmp_path):
    """TRL's GKD generates on-policy completions into its batch inside ``training_step`` (``inputs["input_ids"] =
    ...``, in place); transformers counts tokens and FLOPs after the step, so of the rewritten batch. cadence too
    (counted before the step, its total_flos was 3% short of transformers' on GKD)."""
    from tiny import tiny_gpt2

    tokenizer = word_tokenizer()
    rows = [{"input_ids": r["input_ids"]} for r in tokenized(text_rows(16), tokenizer)]
    results = {}
    for lib in (transformers, __import__("cadence")):
        class Extends(lib.Trainer):
            def training_step(self, model, inputs, num_items_in_batch=None):
                for key in ("input_ids", "attention_mask", "labels"):  # a longer "completion", as GKD's
                    inputs[key] = torch.cat([inputs[key], inputs[key][:, :3]], dim=1)
                return super().training_step(model, inputs, num_items_in_batch)

        args = make_args(str(tmp_path / lib.__name__), lib, max_steps=2, per_device_train_batch_size=4,
                         logging_steps=1, include_num_input_tokens_seen="all", seed=3)
        trainer = Extends(tiny_gpt2(), args, train_dataset=rows, processing_class=tokenizer,
                          data_collator=transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False))
        trainer.train()
        results[lib.__name__] = (trainer.state.num_input_tokens_seen, trainer.state.total_flos)
    assert results["cadence"][0] == results["transformers"][0] > 0
    assert results["cadence"][1] == pytest.approx(results["transformers"][1], rel=1e-12)


class _Renamed(torch.nn.Module):
    """A GPT-2 fed ``anchor_input_ids`` (sentence-transformers' and ORPO's batches): the main input is absent."""

    def __init__(self):
        super().__init__()
        from tiny import tiny_gpt2

        self.inner = tiny_gpt2()

    def num_parameters(self, exclude_embeddings=False):
        return self.inner.num_parameters(exclude_embeddings=exclude_embeddings)

    def forward(self, anchor_input_ids, labels):
        return self.inner(input_ids=anchor_input_ids, labels=labels)


@pytest.mark.parametrize("kind", ["no_num_parameters", "no_main_input"])
def test_flos_without_a_count_are_transformers_zero(tmp_path, kind):
    """Where transformers cannot count FLOPs (the model has no ``num_parameters``, or the batch has no main input)
    it logs ``total_flos`` 0, and so does cadence: the same number in the logs, not an estimate of its own."""
    from tiny import RegressionDataset, RegressionModel

    ids = torch.arange(32).view(4, 8) % 64
    rows = [{"anchor_input_ids": r, "labels": r} for r in ids.repeat(4, 1)]
    results = {}
    for lib in (transformers, __import__("cadence")):
        args = make_args(str(tmp_path / lib.__name__), lib, max_steps=3, per_device_train_batch_size=4,
                         logging_steps=1, remove_unused_columns=False)
        model, data = (RegressionModel(), RegressionDataset(16)) if kind == "no_num_parameters" else (_Renamed(), rows)
        trainer = lib.Trainer(model, args, train_dataset=data)
        trainer.train()
        results[lib.__name__] = (trainer.state.total_flos, trainer.state.log_history[-1].get("total_flos"))
    assert results["cadence"] == results["transformers"] == (0, 0)
    assert trainer.state.num_input_tokens_seen == 0


# ---------------------------------------------------------------------------------- auto_find_batch_size
class OutOfMemoryTagger(torch.nn.Module):
    """A TokenTagger (float64) that runs out of memory above a batch size once warmed up, like a growing cache."""

    def __init__(self, train_limit=None, eval_limit=None, after_calls=0):
        super().__init__()
        from tiny import TokenTagger

        self.inner = TokenTagger(dtype=torch.float64, seed=4)
        self.train_limit, self.eval_limit, self.after_calls, self.calls, self.ooms = train_limit, eval_limit, after_calls, 0, 0
        self.failed_sizes = []

    def forward(self, input_ids, labels=None):
        limit = self.train_limit if self.training else self.eval_limit
        self.calls += 1
        if limit is not None and input_ids.shape[0] > limit and self.calls > self.after_calls:
            self.ooms += 1
            self.failed_sizes.append(input_ids.shape[0])
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected: batch {input_ids.shape[0]} > {limit})")
        return self.inner(input_ids, labels)


def accelerate_sizes(start, fits):
    """The batch sizes accelerate's find_executable_batch_size (which transformers' auto_find_batch_size uses)
    tries from ``start`` when sizes above ``fits`` run out of memory."""
    from accelerate.utils import find_executable_batch_size

    tried = []

    @find_executable_batch_size(starting_batch_size=start)
    def attempt(batch_size):
        tried.append(batch_size)
        if batch_size > fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")

    attempt()
    return tried


def oom_run(out_dir, model, **kw):
    from tiny import TokenDataset, pad_collate

    args = make_args(out_dir, per_device_train_batch_size=8, gradient_accumulation_steps=2, num_train_epochs=2,
                     learning_rate=0.05, logging_steps=1, seed=9, **kw)
    trainer = Trainer(model, args, train_dataset=TokenDataset(60), data_collator=pad_collate)
    trainer.train()
    return trainer


def test_auto_find_batch_size_keeps_the_global_batch_and_the_weights(out_dir, caplog):
    reference = oom_run(out_dir, OutOfMemoryTagger())
    # warm for 3 forward passes, then out of memory above 2: the first failure is the 2nd micro-batch of step 2,
    # after the 1st had put its gradients in place, so the step must be redone from zeroed gradients
    model = OutOfMemoryTagger(train_limit=2, after_calls=3)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        trainer = oom_run(out_dir, model, auto_find_batch_size=True)
    assert model.ooms == 6  # 8 -> 7 -> 6 -> 5 -> 4 -> 3 -> 2: 10% smaller each time, as transformers
    assert model.failed_sizes == accelerate_sizes(8, fits=2)[:-1]
    assert "out of memory at per-device train batch size 8: redoing step 2 with micro-batches of 7 (2 x 2 accumulation" in caplog.text
    assert "out of memory at per-device train batch size 3: redoing step 2 with micro-batches of 2 (4 x 2 accumulation" in caplog.text
    assert trainer.state.train_batch_size == 2 and reference.state.train_batch_size == 8
    assert trainer._train_batch_size == 8  # transformers' attribute: the batch loaded (then cut in micro-batches)
    assert trainer.state.global_step == reference.state.global_step == 8  # 8 batches of 8 an epoch -> 4 steps
    for name, value in reference.model.state_dict().items():
        assert torch.allclose(trainer.model.state_dict()[name], value, rtol=0, atol=1e-12), name
    losses = [(h["loss"], r["loss"]) for h, r in zip(trainer.state.log_history, reference.state.log_history) if "loss" in h]
    assert len(losses) == 8 and all(a == pytest.approx(b, rel=1e-12) for a, b in losses)
    start = OutOfMemoryTagger().state_dict()
    assert max((start[k] - v).abs().max().item() for k, v in reference.model.state_dict().items()) > 1e-2  # it trained


def test_a_resumed_run_keeps_the_shrunk_micro_batches(out_dir, tmp_path):
    """As transformers restores its shrunk batch from trainer_state.json with auto_find_batch_size: the resumed
    run starts with the micro-batches the saving run had reached, runs out of memory no more, and ends with the
    unbroken run's weights."""
    from tiny import TokenDataset, pad_collate, stop_at

    def run(out, model, resume=None, callbacks=None):
        args = make_args(out, per_device_train_batch_size=8, gradient_accumulation_steps=2, max_steps=8,
                         learning_rate=0.05, seed=9, auto_find_batch_size=True, save_strategy="steps", save_steps=4)
        trainer = Trainer(model, args, train_dataset=TokenDataset(60), data_collator=pad_collate, callbacks=callbacks)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    unbroken = run(out_dir, OutOfMemoryTagger(train_limit=2, after_calls=3))
    first = run(str(tmp_path / "r"), OutOfMemoryTagger(train_limit=2, after_calls=3), callbacks=[stop_at(4)])
    assert first.state.train_batch_size == 2 and first.model.ooms == 6
    model = OutOfMemoryTagger(train_limit=2)  # would run out of memory at once with batches above 2
    resumed = run(str(tmp_path / "r"), model, resume=True)
    assert model.ooms == 0 and resumed.state.train_batch_size == 2 and resumed.state.global_step == 8
    for name, value in unbroken.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name


def test_out_of_memory_without_auto_find_batch_size_is_raised(out_dir):
    with pytest.raises(torch.OutOfMemoryError, match="injected"):
        oom_run(out_dir, OutOfMemoryTagger(train_limit=4))


def test_eval_out_of_memory_shrinks_only_the_eval_batch(out_dir, caplog):
    from tiny import TokenDataset, pad_collate

    def evaluate(model, **kw):
        args = make_args(out_dir, per_device_eval_batch_size=8, **kw)
        trainer = Trainer(model, args, eval_dataset=TokenDataset(19), data_collator=pad_collate)
        return trainer, trainer.evaluate()

    _, expected = evaluate(OutOfMemoryTagger())
    with caplog.at_level(logging.WARNING, logger="cadence"):
        trainer, metrics = evaluate(OutOfMemoryTagger(eval_limit=3), auto_find_batch_size=True)
    assert metrics["eval_loss"] == pytest.approx(expected["eval_loss"], rel=1e-12)
    assert trainer.args.per_device_eval_batch_size == 3 and trainer.args.per_device_train_batch_size == 8
    assert trainer.model.failed_sizes == accelerate_sizes(8, fits=3)[:-1] == [8, 7, 6, 5, 4]
    assert "eval batch size 8: evaluating again with 7" in caplog.text and "size 4: evaluating again with 3" in caplog.text


def test_eval_dataloader_by_name_removes_columns_too(out_dir):
    rows = {"a": [{"input_ids": [1, 2], "labels": 0, "idx": 0}] * 3, "b": [{"input_ids": [3, 4], "labels": 1, "idx": 1}] * 5}
    trainer = Trainer(ClassifierModel(), make_args(out_dir, per_device_eval_batch_size=2), eval_dataset=rows)
    loader = trainer.get_eval_dataloader("b")
    batches = list(loader)
    assert [b["input_ids"].shape[0] for b in batches] == [2, 2, 1] and set(batches[0]) == {"input_ids", "labels"}


def test_tuple_and_tensor_datasets_train(out_dir):
    from tiny import RegressionDataset, RegressionModel

    ds = RegressionDataset(16)
    tensors = torch.utils.data.TensorDataset(ds.x, ds.y)  # samples are (x, y) tuples: model(x, y)
    trainer = Trainer(RegressionModel(), make_args(out_dir, max_steps=3, per_device_train_batch_size=4, seed=1),
                      train_dataset=tensors)
    batch = next(iter(trainer.get_train_dataloader()))
    assert isinstance(batch, list) and batch[0].shape == (4,)
    assert trainer.train().global_step == 3
