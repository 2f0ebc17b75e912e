"""save_total_limit keeps the newest checkpoints and always the best one, in every combination, and
touches nothing but this output_dir's complete checkpoint-N folders."""

import itertools
import os

import pytest

from cadence.checkpoint_io.folders import rotate_checkpoints

STEPS = [2, 4, 6, 8, 10]


def make(out, steps=STEPS):
    for s in steps:
        os.makedirs(os.path.join(out, f"checkpoint-{s}"))
        open(os.path.join(out, f"checkpoint-{s}", "trainer_state.json"), "w").close()


def left(out):
    return sorted(int(n.split("-")[1]) for n in os.listdir(out) if n.startswith("checkpoint-") and n[11:].isdigit())


def expected(limit, best, newest=10):
    """The rule, written out: the newest `limit` steps, the best one counted among them, and never
    fewer than {newest, best}."""
    if not limit:
        return STEPS
    keep = {newest} | ({best} if best else set())
    for s in reversed(STEPS):
        if len(keep) >= max(limit, len({newest} | ({best} if best else set()))):
            break
        keep.add(s)
    return sorted(keep)


@pytest.mark.parametrize("limit,best", list(itertools.product([None, 0, 1, 2, 3, 5, 9], [None, 2, 6, 8, 10])))
def test_rotation_table(tmp_path, limit, best):
    out = str(tmp_path)
    make(out)
    best_path = os.path.join(out, f"checkpoint-{best}") if best else None
    rotate_checkpoints(out, limit, best_path, just_written=os.path.join(out, "checkpoint-10"))
    assert left(out) == expected(limit, best)
    if best:
        assert best in left(out)
    assert 10 in left(out)


@pytest.mark.parametrize("limit,best", list(itertools.product([1, 2, 3], [None, 2, 6, 10])))
def test_rotation_equals_transformers(tmp_path, limit, best):
    transformers = pytest.importorskip("transformers")
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    make(ours), make(theirs)
    rotate_checkpoints(ours, limit, os.path.join(ours, f"checkpoint-{best}") if best else None,
                       just_written=os.path.join(ours, "checkpoint-10"))
    transformers.trainer_utils.rotate_checkpoints(theirs, limit, os.path.join(theirs, f"checkpoint-{best}") if best else None)
    assert left(ours) == left(theirs)


def test_the_checkpoint_just_written_survives_even_when_not_the_newest(tmp_path):
    """Resumed from checkpoint-4 while a stale checkpoint-10 lingers: the new checkpoint-6 stays."""
    out = str(tmp_path)
    make(out, [4, 6, 10])
    rotate_checkpoints(out, 1, None, just_written=os.path.join(out, "checkpoint-6"))
    assert left(out) == [6]


def test_only_complete_checkpoint_folders_of_this_dir_are_touched(tmp_path):
    out = str(tmp_path)
    make(out)
    others = ["checkpoint-best", "tmp-checkpoint-12", "checkpoint-3x", "run-2", os.path.join("sub", "checkpoint-1")]
    for name in others:
        os.makedirs(os.path.join(out, name))
    os.makedirs(os.path.join(out, "checkpoint-1"))  # incomplete (no trainer_state.json): not a checkpoint
    open(os.path.join(out, "checkpoint-0"), "w").close()  # a file, not a folder
    rotate_checkpoints(out, 1, None, just_written=os.path.join(out, "checkpoint-10"))
    assert left(out) == [0, 1, 10]
    assert all(os.path.exists(os.path.join(out, n)) for n in others)


def test_trainer_keeps_best_and_newest_with_limit_one(tmp_path):
    """What the best-model logic records in state.best_model_checkpoint survives rotation in a real run: during
    training beside the newest (a resume needs it), and alone once training ends (as transformers leaves it)."""
    from test_resume import train

    from cadence import TrainerCallback

    out = str(tmp_path / "run")

    seen = []

    class MarkBest(TrainerCallback):  # stands in for the evaluation that finds step 2 best
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                state.best_model_checkpoint = os.path.join(args.output_dir, "checkpoint-2")

        def on_save(self, args, state, control, **kwargs):
            seen.append(sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")))

    train(out, callbacks=[MarkBest()], save_steps=2, save_total_limit=1, max_steps=8)
    assert seen[-1] == ["checkpoint-2", "checkpoint-8"]
    assert sorted(os.listdir(out)) == ["checkpoint-2"]


def test_a_rotation_killed_mid_delete_leaves_no_partial_checkpoint(tmp_path, monkeypatch):
    """The folder is renamed before it is deleted: a kill inside rmtree (simulated by an exception
    there, after some files are gone) leaves deleting-checkpoint-N, never a half-deleted checkpoint-N,
    and the next run's start-up clean-up removes it."""
    from cadence.checkpoint import writer
    from cadence.checkpoint_io import folders

    out = str(tmp_path)
    make(out)
    real_rmtree = folders.shutil.rmtree

    def killed_half_way(path, ignore_errors=False):
        os.remove(os.path.join(path, "trainer_state.json"))  # part of the folder is already gone
        raise KeyboardInterrupt  # stands for the SIGKILL

    monkeypatch.setattr(folders.shutil, "rmtree", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        rotate_checkpoints(out, 2, None, just_written=os.path.join(out, "checkpoint-10"))
    monkeypatch.setattr(folders.shutil, "rmtree", real_rmtree)
    assert left(out) == [4, 6, 8, 10]  # checkpoint-2 is gone as a checkpoint, whole
    assert all(os.path.exists(os.path.join(out, f"checkpoint-{s}", "trainer_state.json")) for s in left(out))
    assert os.path.isdir(os.path.join(out, "deleting-checkpoint-2"))
    assert writer.remove_incomplete(out) == [tmp_path / "deleting-checkpoint-2"]
    assert sorted(os.listdir(out)) == [f"checkpoint-{s}" for s in (10, 4, 6, 8)]
