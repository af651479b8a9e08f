"""FuseMatMulBiasAct: matmul -> add(bias of rank <= 1, either operand order) -> optional
activation, or matmul -> activation, into one FusedMatMulBiasAct. The bias must broadcast onto
the product without enlarging it (a [k] vector added to a [..., 1] product is a reported
SHAPE_MISMATCH); an operand that varies along the rows (a residual) is no bias and no near
miss. Which activations may join the epilogue is the target's choice; a refused one is a
reported miss, not silence."""
from __future__ import annotations

from ...ir.ops.elementwise import Binary, BinaryFn, Unary
from ...ir.ops.fused import FusedMatMulBiasAct
from ...rewrite import MissReason, P, Rule, V, fail
from .checks import broadcasts_onto, epilogue_activation_allowed, rank_at_most, target_claims

_mm = P.matmul(V("x"), V("w"), name="mm")


def _bias_like(g, v) -> bool:
    """Constant along every axis but the last ([N], [1, N], a scalar): the only operands a bias
    near miss can be reported for. A residual varies along the rows and is no bias at all."""
    return all(d == 1 for d in g.shape_of(v).dims[:-1])


_biased = P.add(_mm, V("b", where=_bias_like), name="add")     # x @ w + b  (or b + x @ w)
_act_biased = P.of(Unary, _biased, name="act")                  # act(x @ w + b)
_act_only = P.of(Unary, _mm, name="act")                        # act(x @ w)


def _build(b, m):
    act = m.op("act").fn if "act" in m.nodes else None
    has_bias = "b" in m.values
    ins = (m.v("x"), m.v("w")) + ((m.v("b"),) if has_bias else ())
    return b.add_node(FusedMatMulBiasAct(act=act, has_bias=has_bias), ins)[0]


def _explain_matmul(g, node, ctx):
    """A matmul left alone whose only consumer subtracts a bias vector from it: written as an
    add of the negated bias, it would fuse. One whose product is cast before a bias add (a
    mixed-precision export) is a dtype miss: the epilogue adds in the product's dtype. (A
    multiply or divide is a scale, not a bias: no advice to write it as an add.)"""
    u = _only_user(g, node.value)
    if u is None:
        return None
    if u.op.kind == "cast":
        add = _only_user(g, u.value)
        if add is not None and add.op.label == "add" and \
                all(_bias_like(g, v) for v in add.inputs if v != u.value):
            return fail(MissReason.DTYPE_MISMATCH,
                        hint="the product is cast before its bias is added: cast the matmul's "
                             "operands instead (or add the bias before the cast) so the bias "
                             "joins the matmul epilogue in one dtype.",
                        detail=f"{u.label} to {g.shape_of(u.value).dtype} between the matmul "
                               f"and the bias add {add.label}")
    if isinstance(u.op, Binary) and u.op.fn is BinaryFn.SUB and u.inputs[0] == node.value:
        if g.shape_of(u.inputs[1]).rank <= 1:
            return fail(MissReason.NON_ADD_BIAS_CONSUMER,
                        hint="write x @ w - b as x @ w + (-b) (negate the bias vector) so it "
                             "fuses into the matmul epilogue.",
                        detail=f"consumer {u.label} subtracts a bias")
    return None


def _only_user(g, v):
    """The one node reading `v`, or None (several, none, or `v` is a graph output)."""
    users = g.users(v)
    return users[0] if len(users) == 1 and not g.is_output(v) else None


_checks = (
    target_claims("fused_matmul_bias_act"),
    rank_at_most("b", 1, MissReason.BIAS_RANK_TOO_HIGH),
    broadcasts_onto("mm", "b"),
    epilogue_activation_allowed("act"),
)

FUSE_MATMUL_BIAS_ACT = Rule(
    "FuseMatMulBiasAct",
    _build,
    pattern=_act_biased | _act_only | _biased,
    checks=_checks,
    anchor=lambda op: op.kind == "matmul",
    explain=_explain_matmul,
    produces="fused_matmul_bias_act",
)
RULES = (FUSE_MATMUL_BIAS_ACT,)
