"""Scalar constants of an ElementwiseRegion's body that its generated kernel reads from an
argument instead of its source: regions that differ only by a scale, a bias, a clip bound or a
leaky slope (per-layer constants) then share one source, so one compiled kernel (the source
text keys the on-disk cache). Each value travels as the exact bits of the C type the kernel
computes it in, one 8-byte slot each, so the kernel computes what the literal computed (no
float -> double -> float round trip; NaN and denormals included).

Some constants stay literals, because the compiler does less work with them (measured in
bench/results/writeups/2026-11-28_region_scalars.md; a runtime scale costs nothing in these
memory-bound loops): 0, 1, -1 and +-inf (x * 1 and x - 0 disappear, a clip to inf is no
compare), a power of two dividing floats (the division becomes a multiply), the operands of
pow (pow(x, 2) becomes x * x), the operands of integer division and remainders (a constant
divisor becomes a multiply), integer clamps (their code depends on the bounds), booleans,
and constants that only constants use (folded when compiled, as before)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...ir.ops.elementwise import Binary, BinaryFn, Clamp, LeakyRelu
from ...ir.ops.io import Constant
from .half import HALF_TYPES, clamp_bounds

__all__ = ["ScalarArgs", "scalar_args"]

_NP = {"float": np.float32, "double": np.float64, "int8_t": np.int8, "int16_t": np.int16,
       "int32_t": np.int32, "int64_t": np.int64, "uint8_t": np.uint8, "uint16_t": np.uint16,
       "uint32_t": np.uint32}
_SLOT = 8  # bytes per value in the packed array


@dataclass(frozen=True)
class ScalarArgs:
    """The body's scalars that are kernel arguments: (node id, attribute) -> slot, and per
    slot the value as a NumPy scalar of its C type ("value" for a Constant node, "lo" / "hi"
    for a clamp, "alpha" for a leaky ReLU)."""

    slots: dict[tuple[int, str], int]
    values: tuple[np.generic, ...]

    def name(self, node: int, attr: str) -> str | None:
        """The C name the kernel reads the scalar by, or None where it stays a literal."""
        slot = self.slots.get((node, attr))
        return None if slot is None else f"s{slot}"

    def decls(self, at: int) -> list[str]:
        """C statements that read every slot from `args[at]` into `const` locals."""
        if not self.values:
            return []
        lines = [f"    const unsigned char* S = (const unsigned char*)args[{at}];"]
        for i, v in enumerate(self.values):
            t = _c_type(v)
            lines.append(f"    {t} s{i}_; memcpy(&s{i}_, S + {i * _SLOT}, sizeof({t}));")
            lines.append(f"    const {t} s{i} = s{i}_;")
        return lines

    def packed(self) -> np.ndarray:
        """The argument array: one 8-byte slot per value, holding its bytes."""
        buf = np.zeros(len(self.values) * _SLOT, np.uint8)
        for i, v in enumerate(self.values):
            raw = np.asarray(v).tobytes()
            buf[i * _SLOT:i * _SLOT + len(raw)] = np.frombuffer(raw, np.uint8)
        return buf


def _c_type(v: np.generic) -> str:
    return next(t for t, np_t in _NP.items() if np_t is type(v))


def scalar_args(body, value_type) -> ScalarArgs:
    """Which scalars of `body` (a region's body graph) are kernel arguments, in body order.
    `value_type(dtype name)` is the C type a value of that dtype is computed in."""
    users: dict[int, list] = {}
    constant_only: set[int] = set()
    for n in body.nodes:
        for v in n.inputs:
            users.setdefault(v.node, []).append(n)
        if isinstance(n.op, Constant) or (
                n.inputs and all(v.node in constant_only for v in n.inputs)):
            constant_only.add(n.id)
    found: list[tuple[tuple[int, str], np.generic]] = []
    for n in body.nodes:
        dt = n.outputs[0].dtype.name
        np_t = _NP.get(value_type(dt)) if dt != "bool" else None
        if np_t is None:
            continue
        op_ = n.op
        if isinstance(op_, Constant) and op_.value.size == 1:
            value = np_t(op_.value.reshape(-1)[0])
            if _passed(value) and _users_allow(n, value, users.get(n.id, ()), constant_only):
                found.append(((n.id, "value"), value))
        elif isinstance(op_, Clamp) and np_t in (np.float32, np.float64):
            lo, hi = (clamp_bounds(op_, dt) if dt in HALF_TYPES else
                      (np_t(float(op_.lo)), np_t(float(op_.hi))))
            found += [((n.id, a), v) for a, v in (("lo", lo), ("hi", hi)) if _passed(v)]
        elif isinstance(op_, LeakyRelu) and np_t in (np.float32, np.float64):
            alpha = (np.float32(HALF_TYPES[dt](op_.alpha)) if dt in HALF_TYPES
                     else np_t(float(op_.alpha)))
            if _passed(alpha):
                found.append(((n.id, "alpha"), alpha))
    return ScalarArgs({key: i for i, (key, _) in enumerate(found)},
                      tuple(v for _, v in found))


def _passed(value: np.generic) -> bool:
    """Whether a value may be an argument: not one that lets the compiler drop work."""
    v = value.item()
    if isinstance(v, float) and math.isnan(v):
        return True
    return not (v in (0, 1, -1) or (isinstance(v, float) and math.isinf(v)))


def _users_allow(node, value: np.generic, users, constant_only: set[int]) -> bool:
    """Whether every reader of the constant `node` computes the same with it as an argument
    and without extra work (see the module docstring)."""
    if not users:
        return False
    for user in users:
        op_ = user.op
        if user.id in constant_only:
            return False
        if isinstance(op_, Binary):
            if op_.fn is BinaryFn.POW:
                return False
            integer = not isinstance(value, np.floating)
            if integer and op_.fn in (BinaryFn.DIV, BinaryFn.MOD, BinaryFn.FMOD):
                return False
            if (not integer and op_.fn is BinaryFn.DIV and user.inputs[1].node == node.id
                    and math.frexp(abs(value.item()))[0] == 0.5):
                return False
    return True
