"""Builder methods for attention and rope."""
from __future__ import annotations


class AttentionBuilder:
    pass
