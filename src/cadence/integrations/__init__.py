"""Integrations with other tools. Nothing here is imported by ``import cadence``.

Experiment trackers (``report_to``): ``registry`` maps each name to its callback module
(``tensorboard``, ``mlflow``, ``wandb``, ``trackio``, ``jsonl``); a tracker's package is imported only
when a run asks for it.
"""
