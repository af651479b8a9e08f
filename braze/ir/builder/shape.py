"""Builder methods for reshape, transpose, narrow, concat, expand, gather, pad, split."""
from __future__ import annotations


class ShapeBuilder:
    pass
