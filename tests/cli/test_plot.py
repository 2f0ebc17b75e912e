"""cadence plot: a PNG that decodes, at the size its panels give, from a cadence run (finished and in
progress) and from a transformers.Trainer run dir; the panels hold the run's numbers."""

import os

import pytest

from cadence import Trainer, TrainerCallback, TrainingArguments
from cadence.cli import main
from cadence.integrations.jsonl import JsonlCallback
from cadence.plot import figure_size, load_history, panels
from tiny import Classifier, ClassDataset, RegressionDataset, RegressionModel

pytest.importorskip("matplotlib")


def decoded_size(path):
    import matplotlib.image

    image = matplotlib.image.imread(path)  # decodes the PNG
    return image.shape[1], image.shape[0]


def test_plot_of_a_cadence_run(out_dir, tmp_path, capsys):
    def accuracy(p):
        return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}

    args = TrainingArguments(out_dir, report_to="jsonl", logging_steps=1, max_steps=6, eval_strategy="steps",
                             eval_steps=3, per_device_train_batch_size=4, disable_tqdm=True, use_cpu=True)
    trainer = Trainer(Classifier(), args, train_dataset=ClassDataset(20), eval_dataset=ClassDataset(8, seed=4),
                      compute_metrics=accuracy)
    trainer.train()
    out = tmp_path / "curves.png"
    assert main(["plot", out_dir, "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    drawn = panels(trainer.state.log_history)
    assert [title for title, _ in drawn] == ["loss", "learning rate", "grad norm", "eval_accuracy"]
    (_, train, _), (_, evals, eval_values) = drawn[0][1][0], drawn[0][1][1]
    assert train == list(range(1, 7)) and evals == [3, 6]
    assert eval_values == [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    assert decoded_size(out) == figure_size(4) == (1000, 700)


def test_plot_of_a_run_in_progress(out_dir, monkeypatch):
    """A callback plots the run from its own output_dir at step 5 of 8: the jsonl written so far is drawn
    (here every log is written at once; test_integrations checks the batching)."""
    monkeypatch.setattr(JsonlCallback, "flush_secs", 0)
    seen = {}

    class PlotNow(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                history, source = load_history(out_dir)
                seen["steps"], seen["source"] = [h["step"] for h in history], source.name
                main(["plot", out_dir])

    args = TrainingArguments(out_dir, report_to="jsonl", logging_steps=1, max_steps=8, save_steps=3,
                             disable_tqdm=True, use_cpu=True)
    Trainer(RegressionModel(), args, train_dataset=RegressionDataset(), callbacks=[PlotNow()]).train()
    # logged through step 4 (step 5 logs after on_step_end); checkpoint-3 holds less: the jsonl wins
    assert seen == {"steps": [1, 2, 3, 4], "source": "log_history.jsonl"}
    assert decoded_size(os.path.join(out_dir, "training_curves.png")) == figure_size(3)


def test_plot_of_a_transformers_trainer_run(tmp_path):
    transformers = pytest.importorskip("transformers")
    out_dir = str(tmp_path / "hf")
    args = transformers.TrainingArguments(out_dir, report_to="none", logging_steps=1, max_steps=6, save_steps=3,
                                          eval_strategy="steps", eval_steps=3, disable_tqdm=True, use_cpu=True)
    trainer = transformers.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(),
                                   eval_dataset=RegressionDataset(16, seed=1))
    trainer.train()
    history, source = load_history(out_dir)  # transformers writes trainer_state.json only into checkpoints
    assert source == tmp_path / "hf" / "checkpoint-6" / "trainer_state.json"
    assert history == trainer.state.log_history[:-1]  # all but the end-of-training summary, logged after the last save
    assert main(["plot", out_dir]) == 0
    assert decoded_size(os.path.join(out_dir, "training_curves.png")) == figure_size(3) == (1000, 700)


def test_plot_errors(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "no log_history.jsonl, trainer_state.json" in capsys.readouterr().err


def _write_jsonl(folder, rows):
    import json

    folder.mkdir()
    (folder / "log_history.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")


def test_plot_skips_rows_that_are_not_logs_and_draws_dollar_metric_names(tmp_path, capsys):
    """null lines, a list, a string step are skipped with a warning; "$" in a metric name is text, not mathtext
    (two of them made matplotlib parse a formula and every plot of the run failed)."""
    run = tmp_path / "run"
    _write_jsonl(run, [{"loss": 1.0, "step": 1}, None, {"loss": 0.9, "step": "2"}, [1, 2], {"loss": 0.7, "step": 3},
                       {"eval_cost_$_in_$": 0.5, "eval_loss": 0.6, "step": 3}])
    history, _ = load_history(run)
    assert history == [{"loss": 1.0, "step": 1}, {"loss": 0.7, "step": 3}, {"eval_cost_$_in_$": 0.5, "eval_loss": 0.6, "step": 3}]
    assert main(["plot", str(run)]) == 0
    assert [title for title, _ in panels(history)] == ["loss", "eval_cost_$_in_$"]
    assert decoded_size(run / "training_curves.png") == figure_size(2)


def test_plot_out_without_extension_writes_the_png_it_prints_and_refuses_unknown_ones(tmp_path, capsys):
    run = tmp_path / "run"
    _write_jsonl(run, [{"loss": 1.0, "step": 1}, {"loss": 0.5, "step": 2}])
    assert main(["plot", str(run), "--out", str(tmp_path / "curves")]) == 0
    assert capsys.readouterr().out.strip() == f"cadence plot: {tmp_path / 'curves.png'}"
    assert decoded_size(tmp_path / "curves.png") == figure_size(1)
    assert main(["plot", str(run), "--out", str(tmp_path / "curves.txt")]) == 2
    assert "--out=" in (err := capsys.readouterr().err) and "cannot write '.txt' files" in err and ".png" in err
    assert not (tmp_path / "curves.txt").exists()


@pytest.mark.parametrize("text, message", [('{"log_history": {"loss": 1}}', "log_history is dict"),
                                           ('{"log_history": "rows"}', "log_history is str"),
                                           ("[1, 2]", "is not a readable trainer_state.json"),
                                           ("{", "is not a readable trainer_state.json")])
def test_plot_of_a_damaged_trainer_state_names_the_file(tmp_path, capsys, text, message):
    (tmp_path / "trainer_state.json").write_text(text)
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(tmp_path / "trainer_state.json") in err and "Traceback" not in err


def test_plot_of_a_log_with_bytes_that_are_not_utf8_names_the_file(tmp_path, capsys, caplog):
    """cadence's jsonl is ASCII (json.dumps escapes the rest): a line of other bytes is damage. It is skipped like a
    line that is not JSON, with a warning naming the file and line; a file with no readable row at all is an
    error naming the file, never a bare UnicodeDecodeError."""
    run = tmp_path / "run"
    run.mkdir()
    log = run / "log_history.jsonl"
    log.write_bytes(b'{"loss": 1.0, "step": 1}\n{"loss": 0.\xff9, "step": 2}\n{"loss": 0.5, "step": 3}\n')
    history, _ = load_history(run)
    assert history == [{"loss": 1.0, "step": 1}, {"loss": 0.5, "step": 3}]
    assert f"{log} line 2 is not UTF-8 text" in caplog.text
    assert main(["plot", str(run)]) == 0
    assert decoded_size(run / "training_curves.png") == figure_size(1)

    log.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe compressed, not text")  # e.g. a gzipped log
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert str(log) in err and "nothing to plot" in err and "Traceback" not in err, err

    log.unlink()  # a trainer_state.json of such bytes: its error names it too
    (run / "trainer_state.json").write_bytes(b'{"log_history": [{"loss": 1.0, "step": 1}], "x": "\xff"}')
    assert main(["plot", str(run)]) == 2
    assert str(run / "trainer_state.json") in (err := capsys.readouterr().err) and "UnicodeDecodeError" in err, err
