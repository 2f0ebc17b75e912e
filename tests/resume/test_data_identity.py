"""Resume recognises its training data: a datasets .map() whose function cannot be hashed gets a random fingerprint
each time (datasets' rule), yet the data is the same, so the resume goes on (with a warning) as in transformers;
other data of the same length resumes by steps, warned (the data position is approximate)."""

import logging
import sqlite3

import pytest
from test_resume import assert_same_run, train
from tiny import TokenDataset

datasets = pytest.importorskip("datasets")

def mapped(seed=0):
    connection = sqlite3.connect(":memory:")

    def unhashable(row):
        """Holds a sqlite connection, which dill cannot pickle: datasets cannot hash this function."""
        connection.execute("select 1")
        return row

    rows = TokenDataset(22, seed=seed).rows
    base = datasets.Dataset.from_dict({"input_ids": [ids.tolist() for ids, _ in rows],
                                       "labels": [labels.tolist() for _, labels in rows]})
    return base.map(unhashable).with_format("torch")


def test_a_random_fingerprint_of_the_same_data_resumes_exactly(tmp_path, caplog):
    full = train(str(tmp_path / "full"), dataset=mapped())
    first, again = mapped(), mapped()
    assert first._fingerprint != again._fingerprint  # datasets drew a random one each time
    train(str(tmp_path / "run"), stop=4, save_steps=4, dataset=first)
    with caplog.at_level(logging.WARNING):
        resumed = train(str(tmp_path / "run"), resume=True, dataset=again)
    assert_same_run(full, resumed)
    assert any("a sample of the rows agree: resuming" in r.getMessage() and first._fingerprint in r.getMessage()
               for r in caplog.records)


def test_other_data_of_the_same_length_resumes_by_steps_with_a_warning(tmp_path, caplog):
    train(str(tmp_path / "run"), stop=4, save_steps=4, dataset=mapped())
    with caplog.at_level(logging.WARNING):  # as transformers resumes: by steps (test_hf_allows.py compares the two)
        _, out = train(str(tmp_path / "run"), resume=True, dataset=mapped(seed=1))
    assert out.global_step == 18
    assert any("another train_dataset" in r.getMessage() and "data position is approximate" in r.getMessage()
               for r in caplog.records)
