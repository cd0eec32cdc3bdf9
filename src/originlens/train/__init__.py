"""Trainers: the Def. 3.1 attention-only model of arXiv 2601.19208 (``assoc``) and next-token
prediction on the gradient-pathways tasks of arXiv 2603.14087 (``ntp``) with the regime grid (``grid``)."""

from .assoc import AssocRun, AssocTrainConfig, AssocTrainer, steps_per_epoch, train_assoc
from .grid import GridConfig, GridResult, run_grid, summarise_grid, t_interval
from .ntp import NTPConfig, Trainer, TrainResult, load_checkpoint, load_probe_metrics, save_checkpoint, train

__all__ = [
    "AssocRun",
    "AssocTrainConfig",
    "AssocTrainer",
    "GridConfig",
    "GridResult",
    "NTPConfig",
    "TrainResult",
    "Trainer",
    "load_checkpoint",
    "load_probe_metrics",
    "run_grid",
    "save_checkpoint",
    "steps_per_epoch",
    "summarise_grid",
    "t_interval",
    "train",
    "train_assoc",
]
