"""braze's error types: every user-facing failure is one of these, with a message that says
what is wrong, where (node, provenance, file) and what to do."""
from __future__ import annotations


class BrazeError(Exception):
    """Base class of every error braze raises on purpose."""


class ShapeError(BrazeError, ValueError):
    """An op got inputs whose shapes or dtypes it cannot accept."""


class GraphError(BrazeError, ValueError):
    """A graph is malformed: unknown value, bad arity, cycle, dangling output, ..."""


class VerifyError(GraphError):
    """`bz.verify` found a broken invariant."""


class ParseError(BrazeError, ValueError):
    """Text IR or a saved file could not be read."""


class InterpretError(BrazeError, RuntimeError):
    """The reference interpreter failed while executing a node."""


class PassError(BrazeError, RuntimeError):
    """A pass broke the graph (verification or numeric check after it failed)."""


class FrontendError(BrazeError, ValueError):
    """A model file or module could not be imported: names the file and node and what to do."""


class UnsupportedOpsError(FrontendError):
    """The model uses ops braze cannot import; `ops` maps each op type to one node using it."""

    def __init__(self, message: str, ops: dict[str, str]):
        super().__init__(message)
        self.ops = dict(ops)


class AutodiffError(BrazeError, ValueError):
    """A graph cannot be differentiated as asked: names the op or value and what to do."""
