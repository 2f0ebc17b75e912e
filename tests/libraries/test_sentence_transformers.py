"""sentence-transformers' trainers on cadence (issue 27): ``cadence.patch_transformers()`` before importing
sentence_transformers makes its four trainers (SentenceTransformer, CrossEncoder, SparseEncoder, MultiVectorEncoder) subclasses of cadence's Trainer; it then logs transformers'
losses and ends on transformers' weights.

Each comparison runs ``tests/workers/st_worker.py`` twice in fresh processes (transformers' Trainer, then cadence's: a patch
cannot be undone in one process), on a tiny BERT built from a config, ``tiny.word_tokenizer`` and local data: no Hub.
Both do the same float32 arithmetic in the same order, so 1e-5 is far above what they differ by (0.0 measured) and far
below a real difference (a dropped column, a different loss scaling move losses by 1e-2).
"""

from __future__ import annotations

import os

import pytest
import torch

import dist_exit

TOL = 1e-5
# time measurements (total_flos is compared: 0 on both, the batches have no main input transformers counts)
NOT_COMPARED = {"train_runtime", "train_samples_per_second", "train_steps_per_second"}


def run_worker(case: str, cadence: bool, out: str) -> dict:
    proc = dist_exit.launch("st_worker.py", case, out, *(["--cadence"] if cadence else []), nproc=1, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(os.path.join(out, "result.pt"))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["sentence_transformer", "cross_encoder", "sparse_encoder", "multi_vector_encoder"])
def test_sentence_transformers_trainer_matches_transformers(case, tmp_path):
    reference = run_worker(case, False, str(tmp_path / "hf"))
    ours = run_worker(case, True, str(tmp_path / "cadence"))
    theirs = {(s, k): v for s, k, v in reference["losses"] if k not in NOT_COMPARED}
    mine = {(s, k): v for s, k, v in ours["losses"] if k not in NOT_COMPARED}
    assert sorted(mine) == sorted(theirs)
    assert len([k for _, k in theirs if k == "loss"]) == 4  # every step logged
    for key, value in theirs.items():
        assert abs(mine[key] - value) <= TOL, (key, value, mine[key])
    assert reference["weights"].keys() == ours["weights"].keys()
    for name, w in reference["weights"].items():
        assert (w - ours["weights"][name]).abs().max().item() <= TOL, name


@pytest.mark.slow
def test_sentence_transformer_with_evaluation_and_saves_matches_transformers(tmp_path):
    """A whole SentenceTransformer run (issue 36): evaluations and checkpoint saves every 2 steps, then evaluate().
    sentence-transformers' save puts the model in eval mode, so the steps after it trained without dropout where
    transformers' training_step sets training mode again; and its evaluate() crashed without label names. Now the
    per-step losses, eval losses, the mode after train() and the weights are transformers' (1e-5, as above)."""
    reference = run_worker("sentence_transformer_whole", False, str(tmp_path / "hf"))
    ours = run_worker("sentence_transformer_whole", True, str(tmp_path / "cadence"))
    theirs = {(s, k): v for s, k, v in reference["losses"] if k not in NOT_COMPARED and "runtime" not in k
              and "per_second" not in k}
    mine = {(s, k): v for s, k, v in ours["losses"] if (s, k) in theirs}
    assert sorted(mine) == sorted(theirs)
    assert len([k for _, k in theirs if k == "eval_loss"]) == 3  # steps 2 and 4, and evaluate() after training
    for key, value in theirs.items():
        assert abs(mine[key] - value) <= TOL, (key, value, mine[key])
    for name, w in reference["weights"].items():
        assert (w - ours["weights"][name]).abs().max().item() <= TOL, name

