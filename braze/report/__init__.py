"""The fusion report: what fused, what did not, why, and how to fix it."""
from ..rewrite.miss import MissedFusion, MissReason  # noqa: F401
from .fusion_report import FusionReport  # noqa: F401
