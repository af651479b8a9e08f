"""Builder methods for conv2d, conv_transpose2d, pooling, resize."""
from __future__ import annotations


class ConvBuilder:
    pass
