"""Gated-MLP fusions (SwiGLU, GeGLU: any activation) into FusedSwiGLU. FuseSwiGLU:
act(narrow(h)) * narrow(h) over the two halves of one h (what FuseSharedInputMatMul leaves of
gate/up), either half the gate. FuseSwiGLUDualMatmul: act(x @ wg) * (x @ wu) in one step,
weights concatenated as the shared-input fusion does. SiLU may be written as g * sigmoid(g)."""
from __future__ import annotations

from ...ir.ops.elementwise import Unary, UnaryFn
from ...rewrite import Match, MissReason, P, Rule, V, fail
from .checks import target_claims
from .shared_matmul import concat_weights

__all__ = ["FUSE_SWIGLU", "FUSE_SWIGLU_DUAL_MATMUL", "SPLIT_RULES", "DUAL_RULES", "RULES"]


def _silu_of(gate):
    """act(gate) for any activation (SiLU: SwiGLU, gelu: GeGLU, ...), or gate * sigmoid(gate)
    (SiLU written out, either operand order)."""
    return (P.of(Unary, gate, name="act", fn=lambda f: f.is_activation)
            | P.mul(gate, P.sigmoid(gate, name="sig"), name="act"))


def _act(m: Match) -> UnaryFn:
    op = m.op("act")
    return op.fn if isinstance(op, Unary) else UnaryFn.SILU


def float_gate(m: Match, ctx):
    """The gated product is a float tensor (FusedSwiGLU computes in floating point)."""
    dt = m.shape("mul").dtype
    if not dt.is_float:
        return fail(MissReason.DTYPE_MISMATCH,
                    hint="FusedSwiGLU computes in floating point: an integer gated product "
                         "stays unfused; compute the projections in a float dtype to fuse it.",
                    detail=f"the gated product is {dt}, not a float tensor")
    return None


# -- FuseSwiGLU: the split form ----------------------------------------------------------------
_gate_half = P.narrow(V("h"), name="gate")
_up_half = P.narrow(V("h_up"), name="up")
_split = P.mul(_silu_of(_gate_half), _up_half, name="mul")      # silu(h[a]) * h[b]


def same_source(gate: str, up: str, hint: str):
    """Gate and up come from the same value (else NOT_SHARED_INPUT, with `hint`)."""

    def check(m: Match, ctx):
        if m.values[gate] != m.values[up]:
            g = m.graph
            return fail(MissReason.NOT_SHARED_INPUT, hint=hint,
                        detail=f"gate reads {g.node(m.values[gate]).label}, up reads "
                               f"{g.node(m.values[up]).label}")
        return None

    check.__name__ = f"same_{gate}_{up}"
    return check


def halves_of_h(m: Match, ctx):
    """The gate and up narrows are the two equal halves of h's last axis."""
    h = m.shape("h")
    gate, up = m.op("gate"), m.op("up")
    last = h.rank - 1
    if gate.axis != last or up.axis != last:
        return fail(MissReason.AXIS_MISMATCH,
                    detail=f"narrows on axes {gate.axis}, {up.axis}; h {h} splits on {last}")
    d = h.dims[-1]
    if not isinstance(d, int):
        return fail(MissReason.DYNAMIC_SHAPE, detail=f"h {h} has a symbolic last dim")
    half = d // 2
    spans = sorted([(gate.start, gate.length), (up.start, up.length)])
    if d % 2 or spans != [(0, half), (half, half)]:
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"gate [{gate.start}, {gate.start + gate.length}) and up "
                           f"[{up.start}, {up.start + up.length}) do not split h {h} into "
                           "two equal halves")
    return None


def _build_split(b, m: Match):
    return b.fused_swiglu(m.v("h"), gate_first=m.op("gate").start == 0, act=_act(m))


FUSE_SWIGLU = Rule(
    "FuseSwiGLU",
    _build_split,
    pattern=_split,
    checks=(
        target_claims("fused_swiglu"),
        float_gate,
        same_source("h", "h_up", "gate and up must be the two halves of one tensor; fuse the "
                    "projections first (FuseSharedInputMatMul)."),
        halves_of_h,
    ),
    produces="fused_swiglu",
)


# -- FuseSwiGLUDualMatmul: two projections in one step -----------------------------------------
_gate_mm = P.matmul(V("x"), V("wg"), name="gate_mm")
_up_mm = P.matmul(V("x_up"), V("wu"), name="up_mm")
_dual = P.mul(_silu_of(_gate_mm), _up_mm, name="mul")           # silu(x @ wg) * (x @ wu)


def gate_up_weights_match(m: Match, ctx):
    """wg and wu are [K, N] matrices of one shape (so x @ [wg|wu] splits into equal halves)."""
    wg, wu = m.shape("wg"), m.shape("wu")
    if wg.rank != 2 or wg.dims != wu.dims:
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"gate weight {wg} and up weight {wu} must be equal [K, N] matrices")
    if not isinstance(wg.dims[-1], int):
        return fail(MissReason.DYNAMIC_SHAPE, detail=f"gate weight {wg} has a symbolic width")
    return None


def _build_dual(b, m: Match):
    w = concat_weights(b, m, [m.values["wg"], m.values["wu"]])
    return b.fused_swiglu(b.matmul(m.v("x"), w), gate_first=True, act=_act(m))


FUSE_SWIGLU_DUAL_MATMUL = Rule(
    "FuseSwiGLUDualMatmul",
    _build_dual,
    pattern=_dual,
    checks=(
        target_claims("fused_swiglu"),
        float_gate,
        same_source("x", "x_up", "gate and up projections read different inputs, so their "
                    "weights cannot be concatenated; feed both from the same tensor."),
        gate_up_weights_match,
    ),
    produces="fused_swiglu",
)

SPLIT_RULES = (FUSE_SWIGLU,)
DUAL_RULES = (FUSE_SWIGLU_DUAL_MATMUL,)
RULES = DUAL_RULES + SPLIT_RULES
