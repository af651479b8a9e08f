"""RLX's `Graph` names on braze, written as a user porting RLX code would write them: `ln` is
LayerNorm (the logarithm is `log`), layer_norm2d, group_norm in RLX's argument order, the
attention variants (attention / attention_opts / attention_kind / attention_kind_opts /
attention_bias / attention_ with num_heads, head_dim and an optional checked output shape),
and the graph queries (use_count, topo_order, reverse_topo, has_dynamic_dims,
dynamic_symbols, bind, inspect). Whole blocks built with RLX names are compared with the same
blocks built with braze's names, through the interpreter and through `bz.fuse`."""
import numpy as np
import pytest

import braze as bz
from braze.ir.op import Value
from braze.ir.ops.attention import MaskKind
from braze.ir.ops.norm import LayerNorm

RNG = np.random.default_rng(8)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def np_layer_norm(a, gamma, beta, eps, axes=(-1,)):
    a = a.astype(np.float64)
    mu = a.mean(axis=axes, keepdims=True)
    var = ((a - mu) ** 2).mean(axis=axes, keepdims=True)
    return (a - mu) / np.sqrt(var + eps) * gamma + beta


# -- ln is LayerNorm, log is the logarithm -------------------------------------------------------
def test_ln_is_layer_norm_over_the_last_axis_with_rlx_argument_order():
    g = bz.Graph("ln")
    x = g.input("x", bz.Shape((3, 5, 8)))
    gamma, beta = g.param("gamma", bz.Shape((8,))), g.param("beta", bz.Shape((8,)))
    y = g.ln(x, gamma, beta, 1e-3)
    assert g.node(y).op == LayerNorm(1e-3, 2, True, True)
    g.set_outputs([y])
    a, ga, be = rand(3, 5, 8) * 4 + 2, rand(8), rand(8)
    (out,) = bz.interpret(g, {"x": a}, {"gamma": ga, "beta": be})
    np.testing.assert_allclose(out, np_layer_norm(a, ga, be, 1e-3), rtol=1e-4, atol=1e-5)


def test_ln_eps_defaults_to_1e_5_and_none_leaves_out_gamma_or_beta():
    g = bz.Graph("ln")
    x = g.input("x", bz.Shape((4, 6)))
    y = g.ln(x, None, None)
    assert g.node(y).op == LayerNorm(1e-5, 1, False, False)
    g.set_outputs([y])
    a = rand(4, 6)
    (out,) = bz.interpret(g, {"x": a})
    np.testing.assert_allclose(out, np_layer_norm(a, 1.0, 0.0, 1e-5), rtol=1e-4, atol=1e-5)


def test_ln_with_one_argument_says_it_is_layer_norm_and_points_to_log():
    g = bz.Graph("ln")
    x = g.input("x", bz.Shape((4,)))
    with pytest.raises(bz.GraphError, match=r"LayerNorm.*g\.log"):
        g.ln(x)


def test_log_is_the_natural_logarithm():
    g = bz.Graph("log")
    x = g.input("x", bz.Shape((7,)))
    g.set_outputs([g.log(x)])
    a = np.abs(rand(7)) + 0.1
    (out,) = bz.interpret(g, {"x": a})
    np.testing.assert_allclose(out, np.log(a), rtol=1e-6)
    assert g.op_counts() == {"log": 1}


# -- layer_norm2d, group_norm in RLX order -------------------------------------------------------
def test_layer_norm2d_normalizes_channels_at_each_position():
    g = bz.Graph("ln2d")
    x = g.input("x", bz.Shape((2, 6, 3, 4)))
    gamma, beta = g.param("gamma", bz.Shape((6,))), g.param("beta", bz.Shape((6,)))
    g.set_outputs([g.layer_norm2d(x, gamma, beta, 1e-6)])
    assert g.count("layer_norm") == 1
    a, ga, be = rand(2, 6, 3, 4) * 3, rand(6), rand(6)
    (out,) = bz.interpret(g, {"x": a}, {"gamma": ga, "beta": be})
    want = np_layer_norm(a, ga[:, None, None], be[:, None, None], 1e-6, axes=(1,))
    assert out.shape == (2, 6, 3, 4)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_layer_norm2d_refuses_a_tensor_without_spatial_dims():
    g = bz.Graph("ln2d")
    x = g.input("x", bz.Shape((2, 6)))
    with pytest.raises(bz.ShapeError, match="layer_norm2d.*rank >= 3"):
        g.layer_norm2d(x)


def test_group_norm_takes_rlx_argument_order_and_braze_order_alike():
    g = bz.Graph("gn")
    x = g.input("x", bz.Shape((2, 6, 3, 3)))
    gamma, beta = g.param("gamma", bz.Shape((6,))), g.param("beta", bz.Shape((6,)))
    rlx = g.group_norm(x, gamma, beta, 3, 1e-4)
    ours = g.group_norm(x, 3, gamma, beta, eps=1e-4)
    assert g.node(rlx).op == g.node(ours).op and g.node(rlx).inputs == g.node(ours).inputs
    with pytest.raises(bz.GraphError, match="int num_groups"):
        g.group_norm(x, gamma, beta, 2.5)


# -- whole blocks: RLX names against braze names ------------------------------------------------
B, S, E, H = 2, 5, 16, 4
D = E // H


def transformer_params(g):
    shapes = {"wqkv": (E, 3 * E), "bqkv": (3 * E,), "wo": (E, E), "bo": (E,), "g1": (E,),
              "b1": (E,), "w1": (E, 2 * E), "bf1": (2 * E,), "w2": (2 * E, E), "bf2": (E,),
              "g2": (E,), "b2": (E,)}
    return {k: g.param(k, bz.Shape(s)) for k, s in shapes.items()}


def transformer_rlx(batch=B, seq=S):
    """A post-norm causal block as RLX code writes it: GraphExt short names, narrow_ for the
    QKV split, attention_kind on packed [B, S, H*D] with num_heads / head_dim and the output
    shape, ln for LayerNorm."""
    g = bz.Graph("block_rlx")
    x = g.input("x", bz.Shape((batch, seq, E)))
    p = transformer_params(g)
    qkv = g.add(g.mm(x, p["wqkv"]), p["bqkv"])
    q, k, v = (g.narrow_(qkv, 2, i * E, E) for i in range(3))
    ctx = g.attention_kind(q, k, v, H, D, MaskKind.CAUSAL, bz.Shape((batch, seq, E)))
    h = g.ln(g.add(x, g.add(g.mm(ctx, p["wo"]), p["bo"])), p["g1"], p["b1"], 1e-5)
    f = g.add(g.mm(g.gelu(g.add(g.mm(h, p["w1"]), p["bf1"])), p["w2"]), p["bf2"])
    g.set_outputs([g.ln(g.add(h, f), p["g2"], p["b2"], 1e-5)])
    return g


def transformer_braze(batch=B, seq=S):
    """The same block with braze's names: heads split by hand, attention(kind="causal"),
    layer_norm."""
    g = bz.Graph("block_braze")
    x = g.input("x", bz.Shape((batch, seq, E)))
    p = transformer_params(g)
    qkv = g.linear_bias(x, p["wqkv"], p["bqkv"])
    heads = [g.transpose(g.reshape(g.narrow(qkv, -1, i * E, E), (batch, seq, H, D)),
                         (0, 2, 1, 3)) for i in range(3)]
    o = g.attention(*heads, kind="causal")
    ctx = g.reshape(g.transpose(o, (0, 2, 1, 3)), (batch, seq, E))
    h = g.layer_norm(g.add(x, g.linear_bias(ctx, p["wo"], p["bo"])), p["g1"], p["b1"])
    f = g.linear_bias(g.gelu(g.linear_bias(h, p["w1"], p["bf1"])), p["w2"], p["bf2"])
    g.set_outputs([g.layer_norm(g.add(h, f), p["g2"], p["b2"])])
    return g


def conv_sources(g):
    x = g.input("x", bz.Shape((2, 4, 6, 6)))
    w1, w2 = g.param("w1", bz.Shape((8, 4, 3, 3))), g.param("w2", bz.Shape((8, 8, 1, 1)))
    ga, be = g.param("ga", bz.Shape((8,))), g.param("be", bz.Shape((8,)))
    return x, w1, w2, ga, be


def conv_rlx():
    """A conv block with RLX's argument orders: layer_norm2d, group_norm(x, gamma, beta, G)."""
    g = bz.Graph("conv_rlx")
    x, w1, w2, ga, be = conv_sources(g)
    y = g.layer_norm2d(g.relu(g.conv2d(x, w1, be, 1, 1)), ga, be, 1e-6)
    y = g.group_norm(g.conv2d(y, w2), ga, be, 2, 1e-5)
    g.set_outputs([g.silu(y)])
    return g


def conv_braze():
    g = bz.Graph("conv_braze")
    x, w1, w2, ga, be = conv_sources(g)
    c = g.transpose(g.relu(g.conv2d(x, w1, be, padding=1)), (0, 2, 3, 1))
    y = g.transpose(g.layer_norm(c, ga, be, eps=1e-6), (0, 3, 1, 2))
    y = g.group_norm(g.conv2d(y, w2), 2, ga, be, eps=1e-5)
    g.set_outputs([g.silu(y)])
    return g


@pytest.mark.parametrize("build", [(transformer_rlx, transformer_braze), (conv_rlx, conv_braze)],
                         ids=["transformer", "conv"])
def test_block_built_with_rlx_names_matches_braze_names_interpreted_and_fused(build):
    rlx, ours = build[0](), build[1]()
    params = bz.init_params(ours, seed=3)
    for seed in (0, 1):
        feeds = bz.random_feeds(ours, seed=seed)
        want = bz.interpret(ours, feeds, params)
        got = bz.interpret(rlx, feeds, params)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
        fused_rlx, report = bz.fuse(rlx, target="cpu")
        fused_ours, _ = bz.fuse(ours, target="cpu")
        assert fused_rlx.op_counts() == fused_ours.op_counts()
        assert fused_rlx.op_counts() != rlx.op_counts(), str(report)  # something fused
        (via_fused,) = bz.interpret(fused_rlx, feeds, params)
        np.testing.assert_allclose(via_fused, want[0], rtol=1e-4, atol=1e-5)


# -- the attention family -----------------------------------------------------------------------
def heads_first_inputs(g, sq=4, sk=6, hkv=2):
    q = g.input("q", bz.Shape((2, 4, sq, 8)))
    k = g.input("k", bz.Shape((2, hkv, sk, 8)))
    v = g.input("v", bz.Shape((2, hkv, sk, 8)))
    return q, k, v


def test_attention_variants_map_onto_the_attention_op():
    g = bz.Graph("att")
    q, k, v = heads_first_inputs(g)
    m = g.input("m", bz.Shape((4, 6)))
    cases = {
        g.attention(q, k, v, m, 4, 8, (2, 4, 4, 8)): (MaskKind.CUSTOM, None, None, 0),
        g.attention_opts(q, k, v, m, 4, 8, None, 0.5, 30.0): (MaskKind.CUSTOM, 0.5, 30.0, 0),
        g.attention_kind(q, k, v, 4, 8, "causal"): (MaskKind.CAUSAL, None, None, 0),
        g.attention_kind(q, k, v, mask_kind=MaskKind.SLIDING_WINDOW, window=3):
            (MaskKind.SLIDING_WINDOW, None, None, 3),
        g.attention_kind_opts(q, k, v, 4, 8, MaskKind.NONE, None, 0.25, 5.0):
            (MaskKind.NONE, 0.25, 5.0, 0),
        g.attention_bias(q, k, v, m, 4, 8): (MaskKind.BIAS, None, None, 0),
        g.attention_(q, k, v, m, 4, 8): (MaskKind.CUSTOM, None, None, 0),
        g.attention_(q, k, v, causal=True): (MaskKind.CAUSAL, None, None, 0),
    }
    for out, (kind, scale, softcap, window) in cases.items():
        op = g.node(out).op
        assert (op.mask, op.scale, op.softcap, op.window) == (kind, scale, softcap, window)
        assert g.shape_of(out) == bz.Shape((2, 4, 4, 8))


def test_attention_opts_numerics_match_numpy_with_scale_and_softcap():
    g = bz.Graph("att")
    q, k, v = heads_first_inputs(g, hkv=4)
    g.set_outputs([g.attention_kind_opts(q, k, v, 4, 8, "causal", None, 0.3, 2.0)])
    a = {n: rand(*s) for n, s in (("q", (2, 4, 4, 8)), ("k", (2, 4, 6, 8)), ("v", (2, 4, 6, 8)))}
    (out,) = bz.interpret(g, a)
    s = np.einsum("bhqd,bhkd->bhqk", a["q"].astype(np.float64), a["k"]) * 0.3
    s = 2.0 * np.tanh(s / 2.0)
    s = np.where(np.arange(6)[None, :] <= np.arange(4)[:, None] + 2, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, p @ a["v"], rtol=1e-4, atol=1e-5)


def test_packed_attention_splits_heads_and_supports_grouped_kv():
    g = bz.Graph("packed")
    q = g.input("q", bz.Shape(("batch", 3, 32)))
    kv = g.input("kv", bz.Shape(("batch", 5, 16)))
    out = g.attention_kind(q, kv, kv, num_heads=4, mask_kind="causal")
    assert g.shape_of(out) == bz.Shape(("batch", 3, 32))
    (node,) = [n for n in g.nodes if n.op.kind == "attention"]
    assert [g.shape_of(i).dims for i in node.inputs] == [
        ("batch", 4, 3, 8), ("batch", 2, 5, 8), ("batch", 2, 5, 8)]
    g.set_outputs([out])
    a, b = rand(2, 3, 32), rand(2, 5, 16)
    (got,) = bz.interpret(g, {"q": a, "kv": b})
    ref = bz.Graph("ref")
    qh = ref.input("q", bz.Shape((2, 4, 3, 8)))
    kh = ref.input("kv", bz.Shape((2, 2, 5, 8)))
    ref.set_outputs([ref.attention(qh, kh, kh, kind="causal")])
    (want,) = bz.interpret(ref, {"q": a.reshape(2, 3, 4, 8).transpose(0, 2, 1, 3),
                                 "kv": b.reshape(2, 5, 2, 8).transpose(0, 2, 1, 3)})
    np.testing.assert_allclose(got, want.transpose(0, 2, 1, 3).reshape(2, 3, 32), rtol=1e-5)


@pytest.mark.parametrize("call, err, msg", [
    (lambda g, q, k, v, m: g.attention_kind(q, k, v, 4, 8, "custom"), bz.GraphError,
     "takes no mask tensor"),
    (lambda g, q, k, v, m: g.attention_kind(q, k, v, "causal"), bz.GraphError,
     "num_heads must be a positive int.*mask_kind="),
    (lambda g, q, k, v, m: g.attention_kind(q, k, v, 8), bz.ShapeError, "num_heads=8"),
    (lambda g, q, k, v, m: g.attention_kind(q, k, v, 4, 16), bz.ShapeError, "head_dim=16"),
    (lambda g, q, k, v, m: g.attention_kind(q, k, v, 4, 8, "none", (2, 4, 4, 16)),
     bz.ShapeError, "given output shape.*differs.*inferred"),
    (lambda g, q, k, v, m: g.attention_kind(q, k, v, shape=bz.Shape((2, 4, 4, 8), bz.f16)),
     bz.ShapeError, "given output shape"),
    (lambda g, q, k, v, m: g.attention_kind(q, k, v, mask_kind="diagonal"), bz.GraphError,
     "unknown attention mask kind"),
    (lambda g, q, k, v, m: g.attention_(q, k, v, m, causal=True), bz.GraphError,
     "not both"),
    (lambda g, q, k, v, m: g.attention_opts(q, k, v, m, 0), bz.GraphError,
     "positive int"),
])
def test_attention_family_errors(call, err, msg):
    g = bz.Graph("att")
    q, k, v = heads_first_inputs(g)
    m = g.input("m", bz.Shape((4, 6)))
    with pytest.raises(err, match=msg):
        call(g, q, k, v, m)


@pytest.mark.parametrize("q_shape, kv_shape, kw, msg", [
    ((2, 3, 32), (2, 5, 32), {}, "needs num_heads"),
    ((2, 3, 30), (2, 5, 32), {"num_heads": 4}, "does not divide"),
    ((2, 3, 32), (2, 5, 32), {"num_heads": 4, "head_dim": 4}, "not head_dim=4"),
    ((2, 3, 32), (2, 5, 12), {"num_heads": 4}, "packed k .* heads of 8"),
])
def test_packed_attention_errors(q_shape, kv_shape, kw, msg):
    g = bz.Graph("packed")
    q, kv = g.input("q", bz.Shape(q_shape)), g.input("kv", bz.Shape(kv_shape))
    with pytest.raises((bz.GraphError, bz.ShapeError), match=msg):
        g.attention_kind(q, kv, kv, **kw)


# -- graph queries ------------------------------------------------------------------------------
def multi_use_graph():
    g = bz.Graph("uses")
    x = g.input("x", bz.Shape((3, 4)))
    a = g.exp(x)
    b = g.mul(a, a)          # reads a twice: one use
    c = g.add(a, b)
    parts = g.split(c, 1, (1, 3))
    g.set_outputs([a, parts[1], a])
    return g, x, a, b, c, parts


def test_use_count_counts_consumer_nodes_once_and_outputs_on_request():
    g, x, a, b, c, parts = multi_use_graph()
    assert [g.use_count(v) for v in (x, a, b, c)] == [1, 2, 1, 1]
    assert g.use_count(a, include_outputs=True) == 4   # mul, add, returned twice
    assert g.use_count(parts[0]) == 0 and g.use_count(parts[0], include_outputs=True) == 0
    assert g.use_count(parts[1], include_outputs=True) == 1
    assert g.use_count(parts[0].node, include_outputs=True) == 1  # a node: any of its outputs
    assert g.use_count(g.node(a)) == g.use_count(a.node) == 2
    with pytest.raises(bz.GraphError, match="not a node id"):
        g.use_count(99)


def assert_topological(g, order):
    pos = {nid: i for i, nid in enumerate(order)}
    assert sorted(order) == list(range(len(g.nodes)))
    for n in g.nodes:
        assert all(pos[v.node] < pos[n.id] for v in n.inputs), n.describe()


def test_topo_order_and_reverse_topo_are_valid_orders():
    for g in (transformer_rlx(), conv_rlx(), multi_use_graph()[0]):
        assert_topological(g, g.topo_order())
        assert_topological(g, list(reversed(g.reverse_topo())))
        first_output = g.reverse_topo()[0]
        assert not g.users(first_output)  # outputs first: the last node reads nothing later


def test_dynamic_symbols_cover_types_expressions_and_dim_attributes():
    g = transformer_rlx("batch", "seq")
    assert g.has_dynamic_dims() and g.dynamic_symbols() == ["batch", "seq"]
    h = bz.Graph("attrs")
    x = h.input("x", bz.Shape(("n", 4)))
    h.set_outputs([h.reshape(x, (-1,)), h.sym_const(("past",))])
    assert h.dynamic_symbols() == ["n", "past"]   # "4*n" in a type, "past" only in an attribute
    static = transformer_rlx()
    assert not static.has_dynamic_dims() and static.dynamic_symbols() == []


def test_bind_specializes_every_dim_and_keeps_numerics():
    g = transformer_rlx("batch", "seq")
    before = str(g)
    bound = g.bind({"batch": 2}, seq=5)
    assert str(g) == before                                    # the input graph is unchanged
    assert not bound.has_dynamic_dims() and bound.dynamic_symbols() == []
    assert all(s.is_static for n in bound.nodes for s in n.outputs)
    assert [n.op for n in bound.nodes if n.op.kind == "reshape"] == [
        n.op for n in transformer_rlx().nodes if n.op.kind == "reshape"]
    bz.verify(bound)
    static = transformer_rlx(2, 5)
    params = bz.init_params(static, seed=1)
    feeds = bz.random_feeds(static, seed=2)
    np.testing.assert_allclose(bz.interpret(bound, feeds, params)[0],
                               bz.interpret(g, feeds, params)[0], rtol=1e-5, atol=1e-6)
    assert bound.op_counts() == static.op_counts()


def test_bind_partially_substitutes_expressions():
    g = bz.Graph("partial")
    x = g.input("x", bz.Shape(("batch", "seq", 4)))
    y = g.reshape(x, (-1, 4))
    g.set_outputs([g.narrow(y, 0, 0, "seq")])
    half = g.bind(batch=3)
    assert half.shape_of(half.outputs[0]).dims == ("seq", 4)
    assert half.shape_of(Value(1)).dims == ("3*seq", 4)  # the reshape: 3*seq rows
    assert half.dynamic_symbols() == ["seq"] and half.has_dynamic_dims()


@pytest.mark.parametrize("args, kw, msg", [
    ((), {"heads": 4}, "no symbolic dim 'heads'.*batch, seq"),
    (({"batch": 2},), {"batch": 3}, "batch is given two values, 2 and 3"),
    (({"batch": -1},), {}, "int >= 0"),
    (({"batch": True},), {}, "int >= 0"),
    (({"batch": 2.0},), {}, "int >= 0"),
    (({"batch*seq": 4},), {}, "symbol names"),
])
def test_bind_errors(args, kw, msg):
    g = transformer_rlx("batch", "seq")
    with pytest.raises(bz.GraphError, match=msg):
        g.bind(*args, **kw)


def test_bind_that_makes_a_node_invalid_names_the_node():
    g = bz.Graph("bad")
    x = g.input("x", bz.Shape(("m", 4)))
    g.set_outputs([g.narrow(x, 0, 1, "n")])
    with pytest.raises(bz.ShapeError, match=r"bind\(m=3, n=5\) makes node %1 \(narrow\)"):
        g.bind(m=3, n=5)


def test_inspect_dumps_the_graph_with_users_and_outputs():
    g, x, a, b, c, parts = multi_use_graph()
    text = g.inspect()
    lines = text.splitlines()
    assert lines[0].startswith("graph 'uses': 5 nodes, 1 inputs, 0 params, 3 outputs")
    assert "symbolic dims: none" in lines[0]
    assert any(ln.strip().startswith("%1 = exp(%x)") for ln in lines)
    assert "2 users (%2, %3), graph output 0, 2" in text
    assert "%4: unused" in text and "%4.1: graph output 1" in text
    assert "test_rlx_surface.py" in text                       # provenance of each node


def test_inspect_one_value_names_op_inputs_users_and_provenance():
    g, x, a, b, c, parts = multi_use_graph()
    text = g.inspect(a)
    assert text.splitlines()[0].startswith("%1 = exp(%x) -> f32[3, 4]")
    assert "op: exp (Unary)" in text
    assert "input 0: %x f32[3, 4] from input" in text
    assert "users (2): %2 (mul), %3 (add); graph output 0, 2" in text
    assert "provenance: test_rlx_surface.py:" in text
    split = g.inspect(parts[1])
    assert "op: split[axis=1, sizes=(1, 3)] (Split)" in split
    assert "output 1: %4.1 f32[3, 3]" in split and "output 0:" not in split
    assert g.inspect("x").startswith("%x = input") and "users (1): %1 (exp)" in g.inspect("x")
    with pytest.raises(bz.GraphError):
        g.inspect("nope")


# -- RLX argument orders on braze's builders ----------------------------------------------------
def test_rlx_argument_orders_build_the_same_nodes_and_check_shapes():
    g = bz.Graph("orders")
    x = g.input("x", bz.Shape((2, 3, 8)))
    w, ga, be = (g.param(n, bz.Shape(s)) for n, s in (("w", (8, 8)), ("ga", (8,)), ("be", (8,))))
    same = [
        (g.binary("add", x, x, bz.Shape((2, 3, 8))), g.binary(x, x, "add")),
        (g.activation("gelu", x, (2, 3, 8)), g.activation(x, "gelu")),
        (g.matmul(x, w, bz.Shape((2, 3, 8))), g.matmul(x, w)),
        (g.layer_norm(x, ga, be, -1, 1e-3, (2, 3, 8)), g.layer_norm(x, ga, be, eps=1e-3)),
        (g.softmax(x, -1, (2, 3, 8)), g.sm(x, -1)),
        (g.reduce(x, "sum", [2], True, (2, 3, 1)), g.sum(x, 2, keepdims=True)),
        (g.cumsum(x, 1, True, (2, 3, 8)), g.cumsum(x, 1, exclusive=True)),
        (g.reshape(x, [6, -1], (6, 8)), g.reshape_(x, (6, 8))),
        (g.concat([x, x], 2, (2, 3, 16)), g.concat_([x, x], 2)),
        (g.gather(w, g.constant([1, 0]), 0, (2, 8)), g.gather_(w, g.constant([1, 0]), 0)),
    ]
    for rlx, ours in same:
        assert g.node(rlx).op == g.node(ours).op
        assert [g.shape_of(v) for v in g.node(rlx).inputs] == [
            g.shape_of(v) for v in g.node(ours).inputs]
    assert not g.node(g.cumsum(x, 1, False, (2, 3, 8))).op.reverse  # a shape is no flag
    for call in (lambda: g.binary("mul", x, x, (2, 3, 9)), lambda: g.matmul(x, w, (3, 8)),
                 lambda: g.activation("relu", x, bz.Shape((2, 3, 8), bz.f16)),
                 lambda: g.layer_norm(x, ga, be, -1, 1e-5, (2, 8)),
                 lambda: g.softmax(x, 1, (2, 3)), lambda: g.reshape(x, (48,), (47,))):
        with pytest.raises(bz.ShapeError, match="given output shape"):
            call()
    assert g.shape(x) == g.shape_of(x) and not g.is_empty() and bz.Graph("e").is_empty()


def test_rope_with_rlx_head_dim_rotates_each_head_of_a_packed_tensor():
    angles = rand(3, 4)
    cos_np, sin_np = np.cos(angles), np.sin(angles)
    g = bz.Graph("rope")
    x = g.input("x", bz.Shape((2, 3, 16)))
    cos, sin = g.constant(cos_np), g.constant(sin_np)
    packed, partial = g.rope(x, cos, sin, 8), g.rope_n(x, cos, sin, 8, 8)
    per_head = g.input("h", bz.Shape((2, 2, 3, 8)))
    g.set_outputs([packed, partial, g.rope(per_head, cos, sin, 8), g.rope(per_head, cos, sin)])
    a = rand(2, 3, 16)
    heads = a.reshape(2, 3, 2, 8).transpose(0, 2, 1, 3)
    out = bz.interpret(g, {"x": a, "h": heads})
    np.testing.assert_allclose(out[2], out[3])
    merged = out[3].transpose(0, 2, 1, 3).reshape(2, 3, 16)
    np.testing.assert_allclose(out[0], merged, rtol=1e-6)
    np.testing.assert_allclose(out[1], merged, rtol=1e-6)
    ropes = [n.op for n in g.nodes if n.op.kind == "rope"]
    assert len(ropes) == 4 and not any(op.interleaved for op in ropes)  # an int is no flag
    with pytest.raises(bz.ShapeError, match="head_dim=6"):
        g.rope(x, cos, sin, 6)


def test_conv_with_rlx_kernel_size_argument():
    g = bz.Graph("conv")
    x = g.input("x", bz.Shape((1, 4, 6, 6)))
    w = g.param("w", bz.Shape((8, 4, 3, 3)))
    wt = g.param("wt", bz.Shape((4, 8, 3, 3)))
    rlx = g.conv2d(x, w, [3, 3], [2, 2], [1, 1], [1, 1], 1)
    assert g.node(rlx).op == g.node(g.conv2d(x, w, None, 2, 1)).op
    up = g.conv_transpose2d(x, wt, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), 1)
    ours = g.conv_transpose2d(x, wt, None, 2, 1, output_padding=1)
    assert g.node(up).op == g.node(ours).op and g.shape_of(up).dims == (1, 8, 12, 12)
    with pytest.raises(bz.ShapeError, match=r"kernel_size \(5, 5\) differs"):
        g.conv2d(x, w, [5, 5])


def test_conv_with_an_int_rlx_kernel_size():
    """A kernel size is an int or a pair (the module's rule): an int where the bias goes is
    the kernel size too, not an error about a non-Value input."""
    g = bz.Graph("conv")
    x = g.input("x", bz.Shape((1, 4, 6, 6)))
    w = g.param("w", bz.Shape((8, 4, 3, 3)))
    wt = g.param("wt", bz.Shape((4, 8, 3, 3)))
    assert g.node(g.conv2d(x, w, 3, 2, 1, 1, 1)).op == g.node(g.conv2d(x, w, None, 2, 1)).op
    up = g.conv_transpose2d(x, wt, 3, 2, 1, 2, 1, 1)  # RLX: dilation 2, output_padding 1
    ours = g.conv_transpose2d(x, wt, None, 2, 1, output_padding=1, dilation=2)
    assert g.node(up).op == g.node(ours).op
    with pytest.raises(bz.ShapeError, match=r"kernel_size \(5, 5\) differs"):
        g.conv2d(x, w, 5)
