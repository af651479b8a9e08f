"""Builder methods for softmax, reduce, cumsum."""
from __future__ import annotations


class ReduceBuilder:
    pass
