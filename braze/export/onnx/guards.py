"""Run-time guards for the bindings a graph refuses (`Input.excludes`).

ONNX has no assert op, so the guard is shape arithmetic that fails: for each exclusion
(dim, lo, hi, why), `bad` = lo <= dim <= hi computed from the inputs' shapes, and a one-element
tensor is reshaped to [1 + bad] by a Reshape named `braze_refuses_<dim>_<span>__<why>`, which
ONNX Runtime reports by name when the binding is refused. Every graph output y becomes
Reshape(y, Concat(Shape(y), <an empty tensor computed from the guards>)): y itself, for every
dtype, which no optimizer can compute without running the guards. Exclusions of static
dims are left out (the graph either always or never holds)."""
from __future__ import annotations

import re

import numpy as np

from ...frontends.onnx.exclusions import GUARD_PREFIX, PASS_PREFIX, REFUSE_PREFIX
from .builder import OnnxBuilder

__all__ = ["guard_outputs", "refusal_name"]

_NAME_CHARS = 160


def refusal_name(dim, lo: int, hi: int | None, why: str) -> str:
    """The failing node's name: what is refused and why, in identifier characters."""
    span = f"eq_{lo}" if hi == lo else f"ge_{lo}" if hi is None else f"in_{lo}_{hi}"
    text = f"{REFUSE_PREFIX}{dim}_{span}__{why}"
    return re.sub(r"\W+", "_", text)[:_NAME_CHARS].rstrip("_")


def guard_outputs(b: OnnxBuilder, inputs, outputs: list[str]) -> list[str]:
    """`outputs` (tensor names) passed through the guards of the Input ops `inputs`; the same
    names when there is nothing to guard. Every node added is named as a guard node."""
    rules = [e for op in inputs for e in op.excludes if not isinstance(e[0], int)]
    if not rules:
        return outputs
    first = len(b.nodes)
    oks = [_refuse(b, *rule) for rule in rules]
    ok = oks[0]
    for other in oks[1:]:
        ok = b.op1("And", ok, other)
    none = b.op1("Slice", b.op1("Cast", ok, to=7), *(b.const(np.asarray([0], np.int64)),) * 2)
    guarded = [b.op1("Reshape", y, b.op1("Concat", b.op1("Shape", y), none, axis=0),
                     name_hint="guarded") for y in outputs]
    for k, node in enumerate(b.nodes[first:]):
        if not node.name.startswith(REFUSE_PREFIX):
            node.name = f"{PASS_PREFIX if node.output[0] in guarded else GUARD_PREFIX}{k}"
    return guarded


def _refuse(b: OnnxBuilder, dim, lo: int, hi: int | None, why: str) -> str:
    """A [1] bool tensor (true) that cannot be computed when `dim` is in lo..hi."""
    n = b.dim_scalar(dim)
    if hi == lo:
        bad = b.op1("Equal", n, b.const(np.int64(lo)))
    else:
        bad = b.op1("GreaterOrEqual", n, b.const(np.int64(lo)))
        if hi is not None:
            bad = b.op1("And", bad, b.op1("LessOrEqual", n, b.const(np.int64(hi))))
    size = b.op1("Add", b.const(np.int64(1)), b.op1("Cast", bad, to=7))
    shape = b.op1("Reshape", size, b.const(np.asarray([1], np.int64)))
    ok = b.op1("Reshape", b.const(np.asarray([True])), shape)
    b.nodes[-1].name = refusal_name(dim, lo, hi, why)
    return ok
