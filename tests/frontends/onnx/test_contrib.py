"""ONNX Runtime contrib ops (braze/frontends/onnx/ops/contrib*.py): each op and attribute /
input-layout / mask-format combination is a one-node model that braze imports and runs with the
reference interpreter, compared with ONNX Runtime on random inputs (symbolic batch / sequence
models at two sizes); the imported graph uses the braze kinds the op means; unsupported forms
raise errors that name the node."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

MS = "com.microsoft"
_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
          np.dtype(np.int64): TensorProto.INT64}


def contrib_model(op_type, inputs, *, attrs=None, n_out=1, out_names=None, domain=MS,
                  dims=None, opset=17, int_outputs=()):
    """A one-node model. `inputs`: (name, array, "input" | "init") in order, None for an
    empty optional input; `dims` overrides declared input dims (symbols) by name;
    `out_names` (list with "" for unnamed optional outputs) overrides y0..y{n_out-1}; outputs
    are float unless named in `int_outputs` (int32)."""
    names, vis, inits = [], [], []
    for item in inputs:
        if item is None:
            names.append("")
            continue
        name, arr, kind = item
        names.append(name)
        if kind == "init":
            inits.append(numpy_helper.from_array(np.asarray(arr), name))
        else:
            shape = (dims or {}).get(name, list(np.shape(arr)))
            vis.append(helper.make_tensor_value_info(name, _TYPES[np.asarray(arr).dtype], shape))
    outs = out_names or [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, names, outs, name="node0", domain=domain, **(attrs or {}))
    ys = [helper.make_tensor_value_info(
        o, TensorProto.INT32 if o in int_outputs else TensorProto.FLOAT, None) for o in outs if o]
    graph = helper.make_graph([node], "g", vis, ys, inits)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def ort_run(m, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def check(m, feeds, rtol=1e-5, atol=1e-5):
    """Import `m`, compare braze's interpreter with ONNX Runtime on `feeds`; the graph."""
    g = bz.import_onnx(m)
    ours = bz.interpret(g, feeds)
    ref = ort_run(m, feeds)
    assert len(ours) == len(ref)
    for a, r in zip(ours, ref, strict=True):
        assert a.shape == r.shape, (a.shape, r.shape)
        if r.dtype.kind in "iu":
            np.testing.assert_array_equal(a, r)
        else:
            np.testing.assert_allclose(a, r, rtol=rtol, atol=atol)
    return g


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def feeds_of(inputs):
    return {name: arr for name, arr, kind in (i for i in inputs if i) if kind == "input"}


# -- norms ------------------------------------------------------------------------------------
@pytest.mark.parametrize("skip_shape", [(2, 5, 16), (1, 5, 16), (5, 16)])
@pytest.mark.parametrize("beta, bias", [(True, True), (True, False), (False, False),
                                        (False, True)])
@pytest.mark.parametrize("outs", [["y"], ["y", "", "", "sum"], ["y", "mean", "istd", "sum"]])
def test_skip_layer_norm(skip_shape, beta, bias, outs):
    ins = [("x", rnd(2, 5, 16), "input"), ("skip", rnd(*skip_shape, seed=1), "input"),
           ("gamma", rnd(16, seed=2), "init"),
           ("beta", rnd(16, seed=3), "init") if beta else None,
           ("bias", rnd(16, seed=4), "init") if bias else None]
    while ins[-1] is None:
        ins.pop()
    m = contrib_model("SkipLayerNormalization", ins, attrs={"epsilon": 1e-5}, out_names=outs)
    g = check(m, feeds_of(ins))
    assert g.op_counts().get("fused_residual_ln") == 1


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("outs", [["y"], ["y", "", "", "sum"], ["y", "", "istd"]])
def test_skip_simplified_layer_norm(bias, outs):
    ins = [("x", rnd(2, 5, 16), "input"), ("skip", rnd(2, 5, 16, seed=1), "input"),
           ("gamma", rnd(16, seed=2), "init")]
    if bias:
        ins.append(("bias", rnd(16, seed=4), "init"))
    m = contrib_model("SkipSimplifiedLayerNormalization", ins, attrs={"epsilon": 1e-6},
                      out_names=outs)
    g = check(m, feeds_of(ins))
    assert g.op_counts().get("fused_residual_rms_norm") == 1


@pytest.mark.parametrize("axis, scale_shape", [(-1, (16,)), (-2, (5, 16)), (2, (16,))])
def test_simplified_layer_norm(axis, scale_shape):
    ins = [("x", rnd(2, 5, 16), "input"), ("scale", rnd(*scale_shape, seed=1), "init")]
    m = contrib_model("SimplifiedLayerNormalization", ins, domain="",
                      attrs={"epsilon": 1e-6, "axis": axis})
    g = check(m, feeds_of(ins))
    assert g.op_counts().get("rms_norm") == 1


# -- activations ------------------------------------------------------------------------------
@pytest.mark.parametrize("op_type, n_in, kind", [
    ("Gelu", 1, "gelu"), ("BiasGelu", 2, "gelu"), ("FastGelu", 1, "gelu_approx"),
    ("FastGelu", 2, "gelu_approx")])
def test_gelu_forms(op_type, n_in, kind):
    ins = [("x", rnd(2, 5, 16, scale=3), "input"), ("bias", rnd(16, seed=1), "init")][:n_in]
    g = check(contrib_model(op_type, ins), feeds_of(ins))
    assert kind in {n.op.fn.value for n in g.nodes if n.op.kind == "unary"}


@pytest.mark.parametrize("alpha, kind", [(1.702, "quick_gelu"), (1.0, "silu"), (0.5, None)])
def test_quick_gelu(alpha, kind):
    ins = [("x", rnd(3, 7, scale=4), "input")]
    g = check(contrib_model("QuickGelu", ins, attrs={"alpha": alpha}), feeds_of(ins))
    fns = {n.op.fn.value for n in g.nodes if n.op.kind == "unary"}
    assert (kind in fns) if kind else fns == {"sigmoid"}


# -- matmul / gemm / conv ---------------------------------------------------------------------
@pytest.mark.parametrize("trans_a, trans_b, alpha", [(0, 0, 1.0), (0, 1, 0.25), (1, 0, 2.0),
                                                     (1, 1, 0.5)])
@pytest.mark.parametrize("b_kind", ["init", "input"])
def test_fused_matmul(trans_a, trans_b, alpha, b_kind):
    a = rnd(2, 3, 6, 4) if trans_a else rnd(2, 3, 4, 6)
    b = rnd(5, 6, seed=1) if trans_b else rnd(6, 5, seed=1)
    if b_kind == "input":
        b = np.broadcast_to(b, (2, 3) + b.shape).copy()
    ins = [("a", a, "input"), ("b", b, b_kind)]
    m = contrib_model("FusedMatMul", ins, attrs={"transA": trans_a, "transB": trans_b,
                                                 "alpha": alpha})
    g = check(m, feeds_of(ins))
    assert g.op_counts().get("matmul") == 1


@pytest.mark.parametrize("act, params", [("Relu", None), ("LeakyRelu", [0.2]),
                                         ("Sigmoid", None), ("Tanh", None)])
def test_fused_gemm(act, params):
    ins = [("a", rnd(4, 6), "input"), ("b", rnd(5, 6, seed=1), "init"),
           ("c", rnd(5, seed=2), "init")]
    attrs = {"transB": 1, "alpha": 0.5, "beta": 2.0, "activation": act}
    if params:
        attrs["activation_alpha"] = params[0]
    check(contrib_model("FusedGemm", ins, attrs=attrs), feeds_of(ins))


@pytest.mark.parametrize("act, params", [("Relu", None), ("Tanh", None), ("Sigmoid", None),
                                         ("LeakyRelu", [0.1]), ("Clip", [-0.5, 0.7]),
                                         ("HardSigmoid", [0.3, 0.4])])
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_conv(act, params, with_z):
    ins = [("x", rnd(1, 3, 8, 8), "input"), ("w", rnd(4, 3, 3, 3, seed=1), "init"),
           ("b", rnd(4, seed=2), "init")]
    if with_z:
        ins.append(("z", rnd(1, 4, 4, 4, seed=3), "input"))
    attrs = {"activation": act, "strides": [2, 2], "pads": [1, 1, 1, 1]}
    if params:
        attrs["activation_params"] = params
    g = check(contrib_model("FusedConv", ins, attrs=attrs), feeds_of(ins))
    assert g.op_counts().get("conv2d") == 1


def test_fused_conv_unknown_activation_names_the_node():
    ins = [("x", rnd(1, 3, 8, 8), "input"), ("w", rnd(4, 3, 3, 3, seed=1), "init")]
    m = contrib_model("FusedConv", ins, attrs={"activation": "Elu"})
    with pytest.raises(FrontendError, match=r"node0.*activation 'Elu'"):
        bz.import_onnx(m)


# -- attention ----------------------------------------------------------------------------------
SYM = {"x": ["batch", "seq", 16], "mask": ["batch", "seq"], "mask3": ["batch", "seq", "seq"],
       "ids": ["batch", "seq"], "seg": ["batch", "seq"], "pos_ids": [1, "seq"],
       "lens": ["batch"], "bias5": ["batch", 2, "seq", "seq"]}


def padding_mask(b, s, seed=0, left=False):
    """0/1 int32 [B, S]: each row keeps a random length; row 0 keeps everything."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, s + 1, b)
    lens[0] = s
    pos = np.arange(s)[None, :]
    keep = pos >= (s - lens[:, None]) if left else pos < lens[:, None]
    return keep.astype(np.int32), lens.astype(np.int32)


def attention_inputs(b, s, mask_form, bias5=False, v_width=16, seed=0):
    width = 32 + v_width
    ins = [("x", rnd(b, s, 16, seed=seed), "input"), ("w", rnd(16, width, seed=1, scale=0.5),
                                                      "init"),
           ("bqkv", rnd(width, seed=2), "init")]
    raw, lens = padding_mask(b, s, seed, left=mask_form in ("startend", "raw2d_left"))
    mask = {"none": None, "raw2d": ("mask", raw, "input"), "lengths": ("lens", lens, "input"),
            "raw2d_left": ("mask", raw, "input"),
            "raw3d": ("mask3", np.broadcast_to(raw[:, None, :], (b, s, s)).copy(), "input"),
            "startend": ("se", np.concatenate([np.full(b, s, np.int32), s - lens]), "input")}
    ins.append(mask[mask_form])
    if bias5:
        ins += [None, ("bias5", rnd(b, 2, s, s, seed=5), "input")]
    while ins[-1] is None:
        ins.pop()
    return ins


@pytest.mark.parametrize("mask_form", ["none", "raw2d", "raw2d_left", "lengths", "raw3d",
                                       "startend"])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_masks(mask_form, causal):
    symbolic = mask_form != "startend"  # a [2B] input has no dim_param for 2*batch
    m = contrib_model("Attention", attention_inputs(2, 5, mask_form),
                      attrs={"num_heads": 2, "unidirectional": causal},
                      dims=SYM if symbolic else None)
    for b, s in ((2, 5), (3, 4)) if symbolic else ((2, 5),):
        ins = attention_inputs(b, s, mask_form, seed=b)
        g = check(m, feeds_of(ins), atol=1e-5)
    assert g.op_counts().get("attention") == 1
    kind = next(n.op.mask for n in g.nodes if n.op.kind == "attention").value
    assert kind == {("none", 0): "none", ("none", 1): "causal"}.get((mask_form, causal), "custom")


@pytest.mark.parametrize("attrs", [{"scale": 0.3}, {"mask_filter_value": -50.0},
                                   {"qkv_hidden_sizes": [16, 16, 8]}])
def test_attention_attributes_and_bias(attrs):
    vw = attrs.get("qkv_hidden_sizes", [0, 0, 16])[2]
    ins = attention_inputs(2, 5, "raw2d", bias5=True, v_width=vw)
    m = contrib_model("Attention", ins, attrs={"num_heads": 2, "unidirectional": 1, **attrs},
                      dims=SYM)
    check(m, feeds_of(ins))
    ins = attention_inputs(1, 3, "raw2d", bias5=True, v_width=vw, seed=4)
    check(m, feeds_of(ins))


def test_attention_present_output():
    ins = attention_inputs(2, 5, "lengths")
    m = contrib_model("Attention", ins, attrs={"num_heads": 4}, out_names=["y", "present"])
    check(m, feeds_of(ins))


def _with_past(ins, b, s, past, mask, heads=2, seed=9):
    """Attention inputs of `s` new tokens with a KV cache of `past`: mask_index [B, P+S] raw
    (or none), past [2, B, N, P, D]."""
    raw, _ = padding_mask(b, past + s, seed)
    return ins + [("mask", raw, "input") if mask else None,
                  ("past", rnd(2, b, heads, past, 16 // heads, seed=seed), "input")]


@pytest.mark.parametrize("seq", [1, 3])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_with_past_appends_to_the_cache(causal, mask, seq):
    """A decode step: keys / values after the cache, `present` = stack(keys, values) of
    P + S positions, a causal query i seeing keys <= P + i, as ONNX Runtime computes."""
    ins = _with_past(attention_inputs(2, seq, "none"), 2, seq, 4, mask)
    m = contrib_model("Attention", ins, attrs={"num_heads": 2, "unidirectional": causal},
                      out_names=["y", "present"])
    g = check(m, feeds_of(ins))
    (att,) = [n for n in g.nodes if n.op.kind == "attention"]
    assert g.shape_of(att.inputs[1]).dims == (2, 2, 4 + seq, 8)
    assert att.op.mask.value == ("custom" if mask else "causal" if causal else "none")


def test_attention_with_past_sequence_length_names_the_node():
    ins = _with_past(attention_inputs(2, 1, "none"), 2, 1, 4, False)
    ins += [None, ("past_len", np.asarray(4, np.int32), "input")]
    m = contrib_model("Attention", ins, attrs={"num_heads": 2})
    with pytest.raises(FrontendError, match=r"node0 \(Attention\).*past_sequence_length"):
        bz.import_onnx(m)


def test_attention_with_past_then_output_projection_fuses_with_the_cache():
    """ORT's fused decode step (Attention with past, then the output projection) becomes one
    FusedAttentionBlock with a KV cache returning `present`'s keys and values."""
    ins = _with_past(attention_inputs(2, 3, "none"), 2, 3, 4, False)
    m = contrib_model("Attention", ins, attrs={"num_heads": 2, "unidirectional": 1},
                      out_names=["ctx", "present"])
    w_o = numpy_helper.from_array(rnd(16, 16, seed=11, scale=0.5), "w_o")
    m.graph.node.append(helper.make_node("MatMul", ["ctx", "w_o"], ["y"], name="out_proj"))
    m.graph.initializer.append(w_o)
    m.graph.output.insert(0, helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
    m.graph.output.remove(m.graph.output[1])  # ctx: read by the projection only
    g = check(m, feeds_of(ins))
    fused, report = bz.fuse(g, "cpu")
    (block,) = [n for n in fused.nodes if n.op.kind == "fused_attention_block"]
    assert block.op.kv_cache and block.op.mask.value == "causal"
    assert not [x for x in report.missed if x.pattern == "FuseAttentionBlock"]
    ref = ort_run(m, feeds_of(ins))
    for a, r in zip(bz.interpret(fused, feeds_of(ins)), ref, strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)


def mha_inputs(b, s, kv, layout, mask=None, bias5=False, seed=0, left=False):
    if layout == "packed_kv":
        ins = [("q", rnd(b, s, 16, seed=seed), "input"),
               ("kv5", rnd(b, kv, 2, 2, 8, seed=seed + 1), "input")]
    elif layout == "bnsh":
        ins = [("q", rnd(b, s, 16, seed=seed), "input"),
               ("k4", rnd(b, 2, kv, 8, seed=seed + 1), "input"),
               ("v4", rnd(b, 2, kv, 8, seed=seed + 2), "input")]
    else:
        ins = [("q", rnd(b, s, 16, seed=seed), "input"), ("k", rnd(b, kv, 16, seed=seed + 1),
                                                          "input"),
               ("v", rnd(b, kv, 12, seed=seed + 2), "input")]
        if layout == "bias":
            ins.append(("bqkv", rnd(44, seed=3), "init"))
    while len(ins) < 4:
        ins.append(None)
    raw, lens = padding_mask(b, kv, seed, left=left)
    ins.append({None: None, "raw2d": ("kmask", raw, "input"),
                "lengths": ("lens", lens, "input")}[mask])
    if bias5:
        ins.append(("bias5", rnd(b, 1, s, kv, seed=6), "input"))
    while ins[-1] is None:
        ins.pop()
    return ins


MHA_DIMS = {"q": ["batch", "seq", 16], "k": ["batch", "kv", 16], "v": ["batch", "kv", 12],
            "kmask": ["batch", "kv"], "lens": ["batch"], "bias5": ["batch", 1, "seq", "kv"],
            "k4": ["batch", 2, "kv", 8], "v4": ["batch", 2, "kv", 8]}


@pytest.mark.parametrize("layout", ["plain", "bias", "bnsh"])
@pytest.mark.parametrize("mask", [None, "raw2d", "lengths"])
def test_multi_head_attention_layouts_and_masks(layout, mask):
    ins = mha_inputs(2, 5, 7, layout, mask, bias5=True)
    m = contrib_model("MultiHeadAttention", ins, attrs={"num_heads": 2}, dims=MHA_DIMS)
    check(m, feeds_of(ins))
    check(m, feeds_of(mha_inputs(3, 2, 4, layout, mask, bias5=True, seed=3)))


def test_multi_head_attention_packed_kv_names_the_node():
    ins = mha_inputs(2, 5, 7, "packed_kv")
    m = contrib_model("MultiHeadAttention", ins, attrs={"num_heads": 2})
    with pytest.raises(FrontendError, match=r"node0 \(MultiHeadAttention\).*packed"):
        bz.import_onnx(m)


@pytest.mark.parametrize("mask, left", [(None, False), ("raw2d", False), ("raw2d", True)])
def test_multi_head_attention_causal_and_present(mask, left):
    ins = mha_inputs(2, 5, 5, "bias", mask, left=left)
    m = contrib_model("MultiHeadAttention", ins, attrs={"num_heads": 2, "unidirectional": 1,
                                                        "scale": 0.2},
                      out_names=["y", "pk", "pv"])
    g = check(m, feeds_of(ins))
    kind = next(n.op.mask for n in g.nodes if n.op.kind == "attention").value
    assert kind == ("causal" if mask is None else "custom")


def _mha_with_past(b, s, past, mask, seed=0):
    ins = [(n, rnd(b, s, 16, seed=seed + i), "input") for i, n in enumerate("qkv")]
    ins.append(("bqkv", rnd(48, seed=seed + 3), "init"))
    raw, _ = padding_mask(b, past + s, seed)
    ins += [("kmask", raw, "input") if mask else None, None,
            ("pk", rnd(b, 2, past, 8, seed=seed + 4), "input"),
            ("pv", rnd(b, 2, past, 8, seed=seed + 5), "input")]
    return ins


@pytest.mark.parametrize("seq", [1, 3])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("causal", [0, 1])
def test_multi_head_attention_with_past_key_and_value(causal, mask, seq):
    ins = _mha_with_past(2, seq, 4, mask)
    m = contrib_model("MultiHeadAttention", ins, attrs={"num_heads": 2, "unidirectional": causal},
                      out_names=["y", "present_k", "present_v"])
    g = check(m, feeds_of(ins))
    kinds = [n.op.kind for n in g.nodes]
    assert kinds.count("attention") == 1 and kinds.count("concat") == 2


def test_multi_head_attention_with_past_key_alone_names_the_node():
    ins = _mha_with_past(2, 1, 4, False)[:-1]
    m = contrib_model("MultiHeadAttention", ins, attrs={"num_heads": 2})
    with pytest.raises(FrontendError, match=r"node0 \(MultiHeadAttention\).*past_key"):
        bz.import_onnx(m)


# -- rotary embedding / embeddings ------------------------------------------------------------
@pytest.mark.parametrize("layout", ["bnsh", "bsd"])
@pytest.mark.parametrize("pos", ["ids", "offset"])
@pytest.mark.parametrize("interleaved, n_rot", [(0, 0), (1, 0), (0, 4), (1, 4)])
def test_rotary_embedding(layout, pos, interleaved, n_rot):
    b, n, s, d = 2, 3, 5, 8
    half = (n_rot or d) // 2
    x = rnd(b, n, s, d) if layout == "bnsh" else rnd(b, s, n * d)
    rng = np.random.default_rng(1)
    pos_ids = (rng.integers(0, 10, (b, s)) if pos == "ids" else np.array([3])).astype(np.int64)
    angles = rnd(12, half, seed=2)
    ins = [("x", x, "input"), ("pos", pos_ids, "input"),
           ("cos", np.cos(angles), "init"), ("sin", np.sin(angles), "init")]
    attrs = {"interleaved": interleaved}
    if n_rot:
        attrs.update(rotary_embedding_dim=n_rot, num_heads=n)
    elif layout == "bsd":
        attrs["num_heads"] = n
    g = check(contrib_model("RotaryEmbedding", ins, attrs=attrs), feeds_of(ins))
    assert g.op_counts().get("rope") == 1


def test_rotary_embedding_constant_offset_reads_table_rows():
    angles = rnd(12, 4, seed=2)
    ins = [("x", rnd(2, 2, 5, 8), "input"), ("pos", np.array([2], np.int64), "init"),
           ("cos", np.cos(angles), "init"), ("sin", np.sin(angles), "init")]
    g = check(contrib_model("RotaryEmbedding", ins), feeds_of(ins))
    assert g.op_counts().get("narrow") == 2 and "gather" not in g.op_counts()


@pytest.mark.parametrize("segments, position_ids", [(True, False), (False, False),
                                                    (True, True)])
def test_embed_layer_norm(segments, position_ids):
    b, s = 2, 6
    rng = np.random.default_rng(0)
    raw, _ = padding_mask(b, s, 1)
    raw[1, 0] = 0  # a zero before ones: mask_index counts the ones
    ins = [("ids", rng.integers(0, 20, (b, s)).astype(np.int32), "input"),
           ("seg", rng.integers(0, 2, (b, s)).astype(np.int32), "input") if segments else None,
           ("word", rnd(20, 16, seed=1), "init"), ("pos_table", rnd(10, 16, seed=2), "init"),
           ("seg_table", rnd(2, 16, seed=3), "init") if segments else None,
           ("gamma", rnd(16, seed=4), "init"), ("beta", rnd(16, seed=5), "init"),
           ("mask", raw, "input")]
    if position_ids:
        ins.append(("pos_ids", rng.integers(0, 10, (1, s)).astype(np.int32), "input"))
    m = contrib_model("EmbedLayerNormalization", ins, attrs={"epsilon": 1e-5},
                      out_names=["y", "mask_index", "sum"], int_outputs=("mask_index",),
                      dims=SYM)
    check(m, feeds_of(ins))
