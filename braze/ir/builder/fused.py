"""Builder methods for fusion-first builders and fused kinds."""
from __future__ import annotations


class FusedBuilder:
    pass
