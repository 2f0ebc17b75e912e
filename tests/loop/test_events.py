"""The exact callback event order of a small run, as written in trainer_callback's docstring."""

from tiny import RegressionDataset, RegressionModel

from cadence import Trainer, TrainerCallback, TrainingArguments

EVENTS = [
    "on_init_end", "on_train_begin", "on_epoch_begin", "on_epoch_end", "on_step_begin", "on_substep_end",
    "on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_log", "on_evaluate", "on_save",
    "on_prediction_step", "on_train_end",
]


class Recorder(TrainerCallback):
    def __init__(self):
        self.events = []

    def __getattribute__(self, name):
        if name in EVENTS:
            return lambda *a, **k: self.events.append(name)
        return super().__getattribute__(name)


def expected_events(num_epochs, batches_per_epoch, ga, logging_steps, eval_steps, save_steps, eval_batches):
    events, step = ["on_init_end", "on_train_begin"], 0
    steps_per_epoch = -(-batches_per_epoch // ga)
    for epoch in range(num_epochs):
        events.append("on_epoch_begin")
        for s in range(steps_per_epoch):
            micro = min(ga, batches_per_epoch - s * ga)
            events.append("on_step_begin")
            events += ["on_substep_end"] * (micro - 1)
            events += ["on_pre_optimizer_step", "on_optimizer_step", "on_step_end"]
            step += 1
            if step % logging_steps == 0:
                events.append("on_log")
            last = step == num_epochs * steps_per_epoch
            if step % eval_steps == 0 or last:  # HF also evaluates at the last step
                events += ["on_prediction_step"] * eval_batches + ["on_log", "on_evaluate"]
            if step % save_steps == 0 or last:
                events.append("on_save")
        events.append("on_epoch_end")
    events += ["on_log", "on_train_end"]
    return events


def test_event_sequence(tmp_path):
    recorder = Recorder()
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=3,
        num_train_epochs=2, logging_steps=2, eval_strategy="steps", eval_steps=3, save_steps=4,
        per_device_eval_batch_size=8, disable_tqdm=True,
        async_save=False,  # on_save at its save step, as transformers; with async saves see test_async_save.py
    )
    trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(40), eval_dataset=RegressionDataset(16),
                      callbacks=[recorder])
    trainer.train()
    # 40 samples / 4 = 10 batches; GA 3 -> steps of 3, 3, 3, 1 micro-batches; 2 eval batches of 8
    assert recorder.events == expected_events(2, 10, 3, 2, 3, 4, 2)
