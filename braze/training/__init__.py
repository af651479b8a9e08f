"""Compiled training: `compile_training` (forward and backward executables around one weight
region, see step.py) and the optimizers it applies (`SGD`, `Adam`)."""
from .optimizers import SGD, Adam, Optimizer
from .step import TrainingStep, WeightRegion, compile_training

__all__ = ["compile_training", "TrainingStep", "WeightRegion", "Optimizer", "SGD", "Adam"]
