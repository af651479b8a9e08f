"""Builder methods for layer_norm, rms_norm, group_norm, batch_norm."""
from __future__ import annotations


class NormBuilder:
    pass
