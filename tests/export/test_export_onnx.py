"""bz.export_onnx: every op kind and every fused kind exports to a model that passes
onnx.checker (full_check) and that ONNX Runtime runs to braze's numbers; fused kinds become ORT
contrib ops on the onnxruntime target; symbolic dims stay dim_params."""
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import braze as bz
import braze.models as models
from braze.export.onnx import ExportError, to_onnx_model
from braze.export.onnx.registry import EXPORTERS
from braze.ir.op import OP_REGISTRY
from braze.op_examples import OP_EXAMPLES, example_graph


def _run(model, feeds):
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def _same(got, want, rtol=1e-4, atol=1e-5):
    assert len(got) == len(want)
    for a, w in zip(got, want, strict=True):
        assert a.shape == w.shape
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(a, w)
        else:
            np.testing.assert_allclose(a, w, rtol=rtol, atol=atol)


def test_every_primitive_kind_has_an_onnx_mapping():
    missing = sorted(k for k, c in OP_REGISTRY.items()
                     if not c.source and not c.composite and c not in EXPORTERS)
    assert not missing, f"add an exporter in braze/export/onnx for: {missing}"


@pytest.mark.parametrize("target", ["standard", "onnxruntime"])
@pytest.mark.parametrize("kind", sorted(OP_EXAMPLES))
def test_every_op_kind_exports_and_runs(kind, target):
    g = example_graph(kind)
    params = bz.init_params(g, 0)
    feeds = bz.random_feeds(g, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # log / divide examples make inf/nan
        want = bz.interpret(g, feeds, params)
    got = _run(to_onnx_model(g, target, params=params), feeds)
    for a, w in zip(got, want, strict=True):
        mask = np.isfinite(w) if w.dtype.kind == "f" else slice(None)
        if w.dtype.kind == "f":
            np.testing.assert_array_equal(np.isnan(a), np.isnan(w))
            np.testing.assert_allclose(a[mask], w[mask], rtol=1e-4, atol=1e-5)
        else:
            np.testing.assert_array_equal(a, w)


@pytest.mark.parametrize("build, contrib", [
    (lambda: models.bert_encoder(2, 32, 2, batch="batch", seq="seq", with_mask=True),
     {"Attention", "SkipLayerNormalization", "BiasGelu"}),
    (lambda: models.gpt2_blocks(2, 32, 2, batch="batch", seq="seq"),
     {"Attention", "SkipLayerNormalization"}),
    (lambda: models.llama_decoder(2, 64, 4, 2, 96, batch="batch", seq="seq"),
     {"SkipSimplifiedLayerNormalization", "MultiHeadAttention", "RotaryEmbedding"}),
    (lambda: models.resnet_basic_block(), {"FusedConv"}),
], ids=["bert", "gpt2", "llama", "resnet"])
def test_fused_builtin_models_use_contrib_ops_and_match(build, contrib):
    g = build()
    params = bz.init_params(g, 0)
    fused, _ = bz.fuse(g, "onnxruntime")
    model = to_onnx_model(fused, "onnxruntime", params=params)
    used = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    assert contrib <= used, used
    for i, sym in enumerate(({"batch": 2, "seq": 5}, {"batch": 1, "seq": 7})):
        feeds = bz.random_feeds(g, i, sym)
        _same(_run(model, feeds), bz.interpret(g, feeds, params), rtol=1e-4, atol=1e-4)
    std = to_onnx_model(fused, "standard", params=params)
    assert all(n.domain in ("", None) for n in std.graph.node)
    feeds = bz.random_feeds(g, 3, {"batch": 2, "seq": 4})
    _same(_run(std, feeds), bz.interpret(g, feeds, params), rtol=1e-4, atol=1e-4)


def test_symbolic_dims_stay_dim_params(tmp_path):
    g = models.bert_encoder(1, 32, 2, batch="batch", seq="seq")
    path = bz.export_onnx(g, tmp_path / "bert.onnx", params=bz.init_params(g, 0))
    m = onnx.load(path)
    dims = [d.dim_param or d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq", 32]
    out = [d.dim_param or d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    assert out == ["batch", "seq", 32]


@pytest.mark.parametrize("dim", ["4*t", "4*t + 3"])
def test_a_symbol_only_an_input_multiple_carries_is_computed_from_it(dim):
    """An audio length declared "400*t" (or a CNN's "32*h + r"): a reshape to t frames reads
    t back from the input's dim, as (dim - r) / k."""
    g = bz.Graph("frames")
    x = g.input("x", bz.Shape(("batch", dim)))
    y = g.narrow(x, 1, 0, "4*t") if "+" in dim else x
    g.set_outputs([g.sum(g.reshape(y, ("batch", "t", 4)), axes=(2,))])
    for t in (1, 5):
        feeds = {"x": np.random.default_rng(t).standard_normal(
            (2, 4 * t + (3 if "+" in dim else 0))).astype(np.float32)}
        _same(_run(to_onnx_model(g), feeds), bz.interpret(g, feeds))


def test_errors_name_the_problem(tmp_path):
    g = models.bert_encoder(1, 32, 2, batch=1, seq=4)
    with pytest.raises(ExportError, match="have no values"):
        bz.export_onnx(g, tmp_path / "x.onnx")
    with pytest.raises(ExportError, match="unknown export target"):
        bz.export_onnx(g, tmp_path / "x.onnx", target="tensorrt", params=bz.init_params(g))
    h = bz.Graph("free")
    x = h.input("x", bz.Shape((2, 3)))
    h.set_outputs([h.arange("n")])                    # a symbol no input carries
    del x
    with pytest.raises(ExportError, match="symbol 'n'"):
        bz.export_onnx(h, tmp_path / "free.onnx")


def test_large_models_use_external_data(tmp_path, monkeypatch):
    import braze.export.onnx.exporter as exporter

    monkeypatch.setattr(exporter, "EXTERNAL_DATA_BYTES", 1000)
    g = models.bert_encoder(1, 32, 2, batch=1, seq=4, seed=0)
    path = bz.export_onnx(g, tmp_path / "big.onnx", target="standard")
    assert (tmp_path / "big.onnx.data").exists()
    feeds = bz.random_feeds(g, 0)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    _same(sess.run(None, feeds), bz.interpret(g, feeds), atol=1e-5)
    back = bz.import_onnx(path)                        # and braze reads it back
    _same(bz.interpret(back, feeds), bz.interpret(g, feeds), atol=1e-5)


def test_a_kind_without_mapping_is_named(tmp_path, monkeypatch):
    from braze.ir.ops.elementwise import Unary

    monkeypatch.delitem(EXPORTERS, Unary)
    g = bz.Graph("g")
    g.set_outputs([g.tanh(g.input("x", bz.Shape((2, 3))))])
    with pytest.raises(ExportError, match=r"node %1 \(tanh\).*no ONNX mapping for op kind 'unary'"):
        bz.export_onnx(g, tmp_path / "x.onnx")


@pytest.mark.parametrize("mask, guarded", [("none", False), ("causal", False), ("custom", True)])
def test_fully_masked_guard_only_where_a_mask_can_hide_every_key(mask, guarded):
    g = bz.Graph("attn")
    q, k, v = (g.input(n, bz.Shape((1, 2, 4, 8))) for n in "qkv")
    m = g.input("m", bz.Shape((1, 1, 4, 4))) if mask == "custom" else None
    g.set_outputs([g.attention(q, k, v, m, kind=mask)])
    model = to_onnx_model(g, "onnxruntime")
    assert ("Where" in {n.op_type for n in model.graph.node}) is guarded
    feeds = bz.random_feeds(g, 0)
    if m is not None:
        feeds["m"][..., 1, :] = -np.inf               # query 1 sees no key: braze gives zeros
    want = bz.interpret(g, feeds)
    _same(_run(model, feeds), want)
    if m is not None:
        assert not want[0][:, :, 1].any()


def _same_nan(got, want):
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("nan_in", ["q", "k", "v", "m"])
def test_masked_attention_export_keeps_input_nan(nan_in):
    """Only the fully masked query is zeroed: a NaN from q, k, v or the mask stays NaN in
    ORT, as in braze's interpreter, and the other rows are unchanged."""
    g = bz.Graph("attn")
    q, k, v = (g.input(n, bz.Shape((1, 2, 4, 8))) for n in "qkv")
    m = g.input("m", bz.Shape((1, 1, 4, 4)))
    g.set_outputs([g.attention(q, k, v, m, kind="custom")])
    feeds = bz.random_feeds(g, 0)
    feeds["m"][..., 1, :] = -np.inf                   # query 1 sees no key
    feeds[nan_in][0, 0, 2, 3] = np.nan                # q/m: query 2's row; k/v: every query
    want = bz.interpret(g, feeds)[0]
    assert np.isnan(want).any()
    if nan_in in "qm":                                # the masked query 1 stays zeros
        assert not want[:, :, 1].any()
    else:                                             # 0 @ v: NaN reaches it through k, v
        assert np.isnan(want[:, :, 1]).any()
    _same_nan(_run(to_onnx_model(g, "onnxruntime"), feeds)[0], want)


@pytest.mark.parametrize("nan_batch", [0, 1])
def test_masked_attention_block_export_keeps_input_nan(nan_batch):
    g = models.bert_encoder(1, 32, 2, batch=2, seq=6, with_mask=True)
    params = bz.init_params(g, 0)
    fused, _ = bz.fuse(g, "onnxruntime")
    assert any(n.op.kind == "fused_attention_block" for n in fused.nodes)
    feeds = bz.random_feeds(g, 4)
    x, mask = "hidden", "mask"
    feeds[mask][...] = 0.0
    feeds[mask][0] = -np.inf                          # batch 0: no query sees a key
    feeds[x][nan_batch, 3, 5] = np.nan
    model = to_onnx_model(fused, "onnxruntime", params=params)
    assert "Attention" in {n.op_type for n in model.graph.node}
    want = bz.interpret(fused, feeds, params)[0]
    assert np.isnan(want[nan_batch]).any() and not np.isnan(want[1 - nan_batch]).any()
    _same_nan(_run(model, feeds)[0], want)


def test_streamed_initializers_parse_as_the_same_model(tmp_path):
    g = models.llama_decoder(1, 64, 4, 2, 96, batch="batch", seq="seq")
    params = bz.init_params(g, 0)
    path = bz.export_onnx(g, tmp_path / "m.onnx", params=params)
    loaded = onnx.load(path)
    assert loaded.SerializeToString() == to_onnx_model(g, params=params).SerializeToString()
    assert len(loaded.graph.initializer) >= len(params)
    onnx.checker.check_model(path, full_check=True)


def _fn_graph(family, fn):
    """A one-node graph applying enum member `fn` of an elementwise / reduce family."""
    from braze.ir.ops.reduce import ReduceFn

    g = bz.Graph(f"{family}_{fn.value}")
    logical = fn.value in ("not", "and", "or", "xor")
    integer = fn.value in ("mod", "fmod")
    dt = bz.bool_ if logical else (bz.i64 if integer else bz.f32)
    x = g.input("x", bz.Shape((3, 4), dt))
    if family == "unary":
        y = g.activation(x, fn)
    elif family == "reduce":
        y = g.reduce(x, ReduceFn(fn.value), (1,), keepdims=False)
    else:
        other = g.input("y", bz.Shape((4,), dt))
        y = g.binary(x, other, fn) if family == "binary" else g.compare(x, other, fn)
    g.set_outputs([y])
    return g


def _fn_cases():
    from braze.ir.ops.elementwise import BinaryFn, CompareFn, UnaryFn
    from braze.ir.ops.reduce import ReduceFn

    return [(fam, fn) for fam, enum in (("unary", UnaryFn), ("binary", BinaryFn),
                                        ("compare", CompareFn), ("reduce", ReduceFn))
            for fn in enum]


@pytest.mark.parametrize("target", ["standard", "onnxruntime"])
@pytest.mark.parametrize("family, fn", _fn_cases(), ids=lambda v: getattr(v, "value", v))
def test_every_function_of_every_elementwise_kind_exports(family, fn, target):
    g = _fn_graph(family, fn)
    feeds = bz.random_feeds(g, 0)
    if fn.value in ("log", "sqrt", "rsqrt"):
        feeds["x"] = np.abs(feeds["x"]) + np.float32(0.1)
    if fn.value in ("mod", "fmod"):
        feeds["y"] = np.where(feeds["y"] == 0, 3, feeds["y"])
    if fn.value == "pow":
        feeds["x"] = np.abs(feeds["x"]) + np.float32(0.1)
    want = bz.interpret(g, feeds)
    _same(_run(to_onnx_model(g, target), feeds), want)


@pytest.mark.parametrize("target", ["standard", "onnxruntime"])
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_modes_export(mode, target):
    g = bz.Graph("pad")
    x = g.input("x", bz.Shape((2, 3, 5)))
    g.set_outputs([g.pad(x, [(0, 0), (1, 2), (2, 1)], 0.5, mode)])
    feeds = bz.random_feeds(g, 0)
    _same(_run(to_onnx_model(g, target), feeds), bz.interpret(g, feeds))


@pytest.mark.parametrize("fuse_for, target", [("cpu", "standard"),
                                               ("onnxruntime", "onnxruntime")])
def test_bf16_policy_graph_exports_its_rounding(fuse_for, target):
    """The policy's rounding inside a fused attention block (round_attention) is written as
    the same Cast pair in front of the output projection, on both targets."""
    from braze.passes.precision import apply_precision

    g = models.bert_encoder(1, 32, 2, batch=2, seq=6, with_mask=True)
    params = bz.init_params(g, 0)
    fused, _ = bz.fuse(g, fuse_for)
    policy_graph, _ = apply_precision(fused, "bf16")
    assert any(getattr(n.op, "round_attention", None) == bz.bf16 for n in policy_graph.nodes)
    model = to_onnx_model(policy_graph, target, params=params)
    feeds = bz.random_feeds(g, 4)
    got = _run(model, feeds)[0]
    want = bz.interpret(policy_graph, feeds, params)[0]
    # f32 sums in another order can flip a later bf16 rounding now and then (2**-8 relative)
    assert np.abs(got - want).max() < 4e-3 * np.abs(want).max()
    assert np.abs(got - want).mean() < 1e-4 * np.abs(want).mean() + 1e-6
    casts = [n for n in model.graph.node if n.op_type == "Cast"
             and n.attribute[0].i == onnx.TensorProto.BFLOAT16]
    assert len(casts) >= 3  # the block's input, its attention result, the MLP's inputs
