"""Trainers: the Def. 3.1 attention-only model of arXiv 2601.19208 (``assoc``)."""
from .assoc import AssocRun, AssocTrainConfig, AssocTrainer, steps_per_epoch, train_assoc

__all__ = ["AssocRun", "AssocTrainConfig", "AssocTrainer", "steps_per_epoch", "train_assoc"]
