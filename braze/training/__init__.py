"""Compiled training: `compile_training` (forward and backward executables around one weight
region, see step.py), the optimizers it applies (`SGD`, `Adam`, `AdamW`), learning-rate
schedules and clipping by global gradient norm."""
from .clipping import clip_grad_norm, global_grad_norm
from .optimizers import SGD, Adam, AdamW, Optimizer
from .schedules import LRSchedule, StepDecay, WarmupCosine, WarmupLinear
from .step import TrainingStep, WeightRegion, compile_training

__all__ = ["compile_training", "TrainingStep", "WeightRegion", "Optimizer", "SGD", "Adam",
           "AdamW", "LRSchedule", "StepDecay", "WarmupCosine", "WarmupLinear", "clip_grad_norm",
           "global_grad_norm"]
