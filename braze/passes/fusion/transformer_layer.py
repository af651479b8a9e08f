"""FuseTransformerLayer (opt-in: pipelines run it when the target sets `whole_layer`): a fused
attention block, its MLP and both residual norms into one FusedTransformerLayer. It runs after
the attention block, residual norm, SwiGLU and matmul-bias-act fusions and matches their output.

Post-norm (BERT): h = ResNorm(x + attn(x)); out = ResNorm(h + mlp(h)).
Pre-norm (GPT-2, LLaMA): h = x + attn(norm1(x)); out = h + mlp(norm2(h)). The residual norm pass
writes the layer's second add as the *next* norm with the sum exposed (its second output), so
the match is rooted there: the layer replaces it and the replacement re-applies that next norm
to the layer's output. norm1 is a plain norm of x (first layer) or the previous layer's exposed
residual norm (x is its sum); in that case norm1 stays outside the match, and its normalized
output, no longer read, is left for dead-code elimination.

In an encoder-decoder decoder layer the cross-attention block (reading the self-attention's
residual and the encoder output) and the MLP form the layer; the self-attention stays a
FusedAttentionBlock, and the report says why."""
from __future__ import annotations

from ...ir.ops.elementwise import Unary, UnaryFn
from ...ir.ops.fused import (
    FusedAttentionBlock,
    FusedMatMulBiasAct,
    FusedResidualLN,
    FusedResidualRmsNorm,
    FusedSwiGLU,
    FusedTransformerLayer,
    LayerStyle,
    MlpKind,
    NormKind,
    QkvInputs,
)
from ...ir.ops.norm import LayerNorm, RmsNorm
from ...rewrite import Alt, Miss, MissReason, P, Pat, Rule, V, fail
from .checks import target_claims

_RES_NORMS = (FusedResidualLN, FusedResidualRmsNorm)
_PLAIN_NORMS = (LayerNorm, RmsNorm)
_MLP_ACTS = {UnaryFn.GELU: MlpKind.GELU, UnaryFn.GELU_APPROX: MlpKind.GELU_APPROX,
             UnaryFn.RELU: MlpKind.RELU}
_MAX_ATTN_INPUTS = 9  # x, [x_kv], w_qkv, b_qkv (or two weights, biases), w_o, b_o, mask; rope


def _is_vector(g, v) -> bool:
    return g.shape_of(v).rank == 1


# -- pattern pieces -----------------------------------------------------------------------------
def residual_norm(a, b, name: str, out: int = 0) -> Alt:
    """Output `out` of ResNorm(a + b [, gamma][, beta]), the sum in either operand order."""
    affine = (V(f"{name}_a0"), V(f"{name}_a1"))
    return Alt(tuple(P.of(_RES_NORMS, x, y, *affine[:n], name=name, out=out)
                     for x, y in ((a, b), (b, a)) for n in (2, 1)))


def same_node(name: str, out: int = 0) -> Pat:
    """A reference to the residual norm captured as `name` elsewhere in the pattern."""
    return Pat(_RES_NORMS, None, name=name, out=out)


def attention_block(x) -> Alt:
    """A FusedAttentionBlock reading `x`, any optional inputs (captured as attn_1, ...)."""
    return Alt(tuple(P.of(FusedAttentionBlock, x, *(V(f"attn_{i}") for i in range(1, n)),
                          name="attn") for n in range(3, _MAX_ATTN_INPUTS + 1)))


def mlp(h) -> Alt:
    """down(act(h @ w1 + b1)) plain or matmul-bias-act fused (biases optional), or SwiGLU:
    FusedSwiGLU(h @ w_gate_up) @ w_down."""
    w1, b1, w2, b2 = V("w1"), V("b1", _is_vector), V("w2"), V("b2", _is_vector)
    up = (P.of(FusedMatMulBiasAct, h, w1, b1, name="up")
          | P.of(FusedMatMulBiasAct, h, w1, name="up")
          | P.of(Unary, P.add(P.matmul(h, w1), b1), name="up")
          | P.of(Unary, P.matmul(h, w1), name="up"))
    down = (P.of(FusedMatMulBiasAct, up, w2, b2, act=None, name="down")
            | P.of(FusedMatMulBiasAct, up, w2, act=None, name="down")
            | P.add(P.matmul(up, w2), b2, name="down")
            | P.matmul(up, w2, name="down"))
    swiglu = P.matmul(P.of(FusedSwiGLU, P.matmul(h, V("w_gate_up")), name="swiglu"),
                      V("w_down"), name="down")
    return down | swiglu


_post_h = residual_norm(V("x"), attention_block(V("x")), "norm1")      # h = norm1(x + attn(x))
_post = residual_norm(_post_h, mlp(same_node("norm1")), "norm2")       # norm2(h + mlp(h))

_norm1 = Alt(tuple(P.of(_PLAIN_NORMS, V("x"), *(V(f"norm1_a{i}") for i in range(n)),
                        name="norm1") for n in (2, 1))) | V("n1")      # norm1(x), or given
_pre_h = residual_norm(V("x"), attention_block(_norm1), "norm2", out=1)  # h = x + attn(n1)
_pre_mlp = mlp(same_node("norm2", out=0))                              # mlp(norm2(h))
_pre = (residual_norm(_pre_h, _pre_mlp, "next")                        # next_norm(h + mlp)
        | P.add(_pre_h, _pre_mlp, name="next"))                        # h + mlp


# -- reading norms ------------------------------------------------------------------------------
def _norm_affine(node):
    """(gamma, beta) input values of a plain or residual norm node (None where absent)."""
    op = node.op
    if isinstance(op, _RES_NORMS):
        r = op.named(node.inputs)
        return r.get("gamma"), r.get("beta")
    rest = list(node.inputs[1:])
    gamma = rest.pop(0) if op.has_gamma else None
    return gamma, (rest.pop(0) if op.has_beta else None)


def _norm_kind(op) -> NormKind:
    return NormKind.RMS if isinstance(op, (RmsNorm, FusedResidualRmsNorm)) else NormKind.LAYER


def _norm1_node(m):
    """The node computing the attention input norm1(x) (pre-norm), or None if it is not one."""
    if "norm1" in m.nodes:
        return m.nodes["norm1"]
    n1, x = m.values["n1"], m.values["x"]
    node = m.graph.nodes[n1.node]
    if isinstance(node.op, _PLAIN_NORMS) and n1.index == 0 and node.inputs[0] == x:
        return node
    if (isinstance(node.op, _RES_NORMS) and node.op.expose_sum and n1.index == 0
            and node.values[1] == x):
        return node
    return None


def _layer_norms(m):
    """(norm1 node, norm2 node) of the layer: post-norm both residual norms; pre-norm norm1 is
    the attention input's norm and norm2 the residual norm after attention."""
    if "next" not in m.nodes:
        return m.nodes["norm1"], m.nodes["norm2"]
    return _norm1_node(m), m.nodes["norm2"]


# -- checks -------------------------------------------------------------------------------------
def attention_reads_norm_of_x(m, ctx) -> Miss | None:
    """Pre-norm: the attention block reads norm1(x), x being the layer's residual input."""
    if "next" in m.nodes and _norm1_node(m) is None:
        return fail(MissReason.PATTERN_MISMATCH,
                    detail="the attention block's input is not a norm of the residual input x")
    return None


def norms_agree(m, ctx) -> Miss | None:
    """Both layer norms are one kind with one eps, a gamma, the same beta presence, over the
    last axis (FusedTransformerLayer has one norm kind and eps)."""
    n1, n2 = _layer_norms(m)
    rank = m.shape("x").rank
    for node in (n1, n2):
        if node.op.axis not in (-1, rank - 1):
            return fail(MissReason.AXIS_MISMATCH,
                        detail=f"{node.label} normalizes axis {node.op.axis}, not the last")
        if not node.op.has_gamma:
            return fail(MissReason.PATTERN_MISMATCH, detail=f"{node.label} has no gamma")
    a, b = n1.op, n2.op
    if (_norm_kind(a), a.eps, a.has_beta) != (_norm_kind(b), b.eps, b.has_beta):
        return fail(MissReason.PATTERN_MISMATCH,
                    detail=f"norm1 ({_norm_kind(a).value}, eps {a.eps}, beta {a.has_beta}) and "
                           f"norm2 ({_norm_kind(b).value}, eps {b.eps}, beta {b.has_beta}) "
                           "differ")
    return None


def mlp_is_supported(m, ctx) -> Miss | None:
    """The MLP activation is GELU / GELU_APPROX / RELU (or SwiGLU), with both biases or none."""
    if "swiglu" in m.nodes:
        act = m.op("swiglu").act
        if act is not UnaryFn.SILU:
            return fail(MissReason.PATTERN_MISMATCH,
                        detail=f"the gated MLP uses {act.value}; the whole-layer kind runs "
                               "SwiGLU (silu) only",
                        hint="the attention block, norms and gated MLP still fuse separately")
        return None
    act = m.op("up").act if isinstance(m.op("up"), FusedMatMulBiasAct) else m.op("up").fn
    if act not in _MLP_ACTS:
        return fail(MissReason.PATTERN_MISMATCH,
                    detail=f"MLP activation {act.value if act else None} is not one of "
                           f"{', '.join(a.value for a in _MLP_ACTS)}")
    if ("b1" in m.values) != ("b2" in m.values):
        return fail(MissReason.PATTERN_MISMATCH,
                    detail="only one of the MLP's two projections has a bias")
    return None


def mlp_biases_fit(m, ctx) -> Miss | None:
    """Each MLP bias is a [N] (or [1]) vector for its projection's width N, so it broadcasts
    onto the product without enlarging it."""
    for w, b in (("w1", "b1"), ("w2", "b2")):
        if b in m.values and m.shape(b).dims not in (m.shape(w).dims[-1:], (1,)):
            return fail(MissReason.SHAPE_MISMATCH,
                        detail=f"MLP bias {b} {m.shape(b)} does not fit the width of weight "
                               f"{w} {m.shape(w)}")
    return None


def residual_shapes(m, ctx) -> Miss | None:
    """x is [B, S, E] and the attention block and MLP outputs have x's exact type."""
    x = m.shape("x")
    if x.rank != 3:
        return fail(MissReason.SHAPE_MISMATCH, detail=f"x must be [B, S, E], got {x}")
    for name in ("attn", "down"):
        if m.shape(name) != x:
            return fail(MissReason.SHAPE_MISMATCH,
                        detail=f"{name} output {m.shape(name)} differs from x {x}")
    return None


# -- replacement --------------------------------------------------------------------------------
def _mlp_inputs(b, m) -> tuple[MlpKind, dict]:
    if "swiglu" in m.nodes:
        w = m.v("w_gate_up")
        if not m.op("swiglu").gate_first:  # the layer reads the gate half first: swap halves
            n = b.shape_of(w).dims[-1] // 2
            w = b.concat([b.narrow(w, -1, n, n), b.narrow(w, -1, 0, n)], -1)
        return MlpKind.SWIGLU, {"w_gate_up": w, "w_down": m.v("w_down")}
    up = m.op("up")
    act = up.act if isinstance(up, FusedMatMulBiasAct) else up.fn
    return _MLP_ACTS[act], {k: m.v(k) for k in ("w1", "b1", "w2", "b2") if k in m.values}


def _build(b, m):
    pre = "next" in m.nodes
    n1, n2 = _layer_norms(m)
    kind, mlp_ins = _mlp_inputs(b, m)
    attn = m.nodes["attn"]
    roles = dict(zip(attn.op.input_roles()[1:], (m.new(v) for v in attn.inputs[1:])))
    roles.update(mlp_ins)
    for i, node in ((1, n1), (2, n2)):
        gamma, beta = _norm_affine(node)
        roles[f"norm{i}_gamma"] = m.new(gamma)
        if beta is not None:
            roles[f"norm{i}_beta"] = m.new(beta)
    op = FusedTransformerLayer(
        style=LayerStyle.PRE_NORM if pre else LayerStyle.POST_NORM, attn=attn.op,
        norm=_norm_kind(n1.op), eps=n1.op.eps, mlp=kind, has_mlp_bias="b1" in roles,
        has_norm_beta="norm1_beta" in roles)
    y = b.add_node(op, [m.v("x")] + [roles[r] for r in op.input_roles()[1:]])[0]
    nxt = m.nodes.get("next")
    if nxt is None or not isinstance(nxt.op, _RES_NORMS):
        return y
    gamma, beta = (None if v is None else m.new(v) for v in _norm_affine(nxt))
    norm = b.rms_norm if isinstance(nxt.op, FusedResidualRmsNorm) else b.layer_norm
    normed = norm(y, gamma, beta, eps=nxt.op.eps, axis=nxt.op.axis)
    return (normed, y) if nxt.op.expose_sum else normed


def _explain_attention_block(g, node, ctx) -> Miss | None:
    """A fused attention block left outside a layer: which part around it does not fit."""
    users = g.users(node.value)
    if len(users) != 1 or not isinstance(users[0].op, _RES_NORMS):
        return fail(MissReason.PATTERN_MISMATCH,
                    hint="run the residual norm fusion before FuseTransformerLayer.",
                    detail="the attention block's output is not read by one fused residual norm")
    cross = [u for u in g.users(users[0].values[0]) if isinstance(u.op, FusedAttentionBlock)
             and u.op.qkv_inputs is not QkvInputs.SELF and u.inputs[0] == users[0].values[0]]
    if cross:
        return fail(MissReason.PATTERN_MISMATCH,
                    hint="nothing to do: the self-attention stays a fused attention block.",
                    detail=f"the attention residual feeds the cross-attention {cross[0].label} "
                           "(an encoder-decoder decoder layer); FusedTransformerLayer holds one "
                           "attention block, and the cross-attention fuses with the MLP")
    return fail(MissReason.PATTERN_MISMATCH,
                hint="run the SwiGLU, residual norm and matmul-bias-act fusions first.",
                detail="the MLP after the attention residual is not a GELU/ReLU two-matmul or "
                       "FusedSwiGLU MLP ending in a residual add or residual norm")


def attention_has_no_kv_cache(m, ctx) -> Miss | None:
    """FusedTransformerLayer has one output: a decode step's block, which also returns the
    present keys / values, stays a FusedAttentionBlock."""
    if not m.op("attn").kv_cache:
        return None
    return fail(MissReason.PATTERN_MISMATCH,
                hint="the attention block of a KV-cache decode step is fused "
                     "(FusedAttentionBlock with kv_cache); its MLP and norms fuse on their own.",
                detail=f"{m.nodes['attn'].label} reads a KV cache and returns the present "
                       "keys / values, which FusedTransformerLayer cannot return")


FUSE_TRANSFORMER_LAYER = Rule(
    "FuseTransformerLayer",
    _build,
    pattern=_post | _pre,
    checks=(target_claims("fused_transformer_layer"), attention_has_no_kv_cache,
            attention_reads_norm_of_x, norms_agree,
            mlp_is_supported, mlp_biases_fit, residual_shapes),
    anchor=lambda op: op.kind == "fused_attention_block",
    explain=_explain_attention_block,
    produces="fused_transformer_layer",
)
RULES = (FUSE_TRANSFORMER_LAYER,)
