"""bz.quantize_dynamic: linear layers with stored weights become DynamicQuantMatMul (weights
int8 per column, the activation quantized per row when it runs); every matmul left alone is a
reported miss with its reason; the interpreter's numbers stay within 8-bit error of the float
graph, the CPU kernel matches the interpreter, the op decomposes (fuse -> unfuse round trip),
other targets legalize it away, and its gradient is straight-through."""
import numpy as np
import pytest

import braze as bz
from braze.errors import BrazeError, GraphError
from braze.passes.quant import quantize_weight
from braze.rewrite import MissReason
from braze.runtime.kernels import int8_gemm


def mlp(batch=6, k=64, hidden=128, n=48, stored=True, act="gelu"):
    """x -> linear(k, hidden) + bias + act -> linear(hidden, n): weights stored (or not)."""
    rng = np.random.default_rng(0)
    g = bz.Graph("mlp")
    x = g.input("x", bz.Shape((batch, k)))

    def p(name, *dims):
        value = (rng.standard_normal(dims) / np.sqrt(dims[0])).astype(np.float32)
        return g.param(name, bz.Shape(dims), value=value if stored else None)

    h = g.add(g.mm(x, p("w1", k, hidden)), p("b1", hidden))
    h = g.activation(h, act) if act else h
    g.set_outputs([g.mm(h, p("w2", hidden, n))])
    return g


def feeds_for(g, seed=1):
    return bz.random_feeds(g, seed)


def misses(report, reason):
    return [m for m in report.misses if m.reason is reason]


def test_fires_on_linear_layers_with_their_bias_and_activation():
    g = mlp()
    q, report = bz.quantize_dynamic(g, min_size=0)
    assert q.op_counts().get("dynamic_quant_matmul") == 2
    assert "matmul" not in q.op_counts() and "gelu" not in q.op_counts()
    first, second = [n.op for n in q.nodes if n.op.kind == "dynamic_quant_matmul"]
    assert first.has_bias and first.act is bz.UnaryFn.GELU
    assert not second.has_bias and second.act is None
    assert report.counts_after["dynamic_quant_matmul"] == 2 and not report.misses
    assert q.weights["w1.int8"].dtype == np.int8 and q.weights["w1.scale"].shape == (128,)
    assert "w1" not in q.weights  # the float weight went with its last reader


def test_numbers_stay_within_8_bit_error_and_the_input_graph_is_unchanged():
    g = mlp()
    before = str(g)
    q, _ = bz.quantize_dynamic(g, min_size=0)
    assert str(g) == before and set(g.weights) == {"w1", "b1", "w2"}
    feeds = feeds_for(g)
    want = bz.interpret(g, feeds)[0]
    got = bz.interpret(q, feeds)[0]
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert 1e-4 < rel < 2e-2


def test_decomposition_matches_the_weights_dequantized():
    """The op's meaning: x quantized per row (ONNX DynamicQuantizeLinear formulas) times the
    dequantized weight, checked against NumPy."""
    g = mlp(act=None)
    q, _ = bz.quantize_dynamic(g, min_size=0)
    x = feeds_for(g)["x"]
    lo, hi = np.minimum(x.min(1), 0), np.maximum(x.max(1), 0)
    scale = (hi - lo) / np.float32(255)
    zp = np.clip(np.rint(-lo / scale), 0, 255)
    xq = (np.clip(np.rint(x / scale[:, None]) + zp[:, None], 0, 255) - zp[:, None]) * \
        scale[:, None]
    w1 = q.weights["w1.int8"].astype(np.float32) * q.weights["w1.scale"]
    h = xq.astype(np.float32) @ w1 + g.weights["b1"]
    got = bz.interpret(q, {"x": x})[0]
    # the second layer quantizes h itself; its first layer's output is checked through it
    h_lo, h_hi = np.minimum(h.min(1), 0), np.maximum(h.max(1), 0)
    h_scale = (h_hi - h_lo) / np.float32(255)
    h_zp = np.clip(np.rint(-h_lo / h_scale), 0, 255)
    hq = (np.clip(np.rint(h / h_scale[:, None]) + h_zp[:, None], 0, 255) - h_zp[:, None]) * \
        h_scale[:, None]
    w2 = q.weights["w2.int8"].astype(np.float32) * q.weights["w2.scale"]
    np.testing.assert_allclose(got, hq.astype(np.float32) @ w2, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_nan_in_a_row_gives_that_row_nans(compiled):
    q, _ = bz.quantize_dynamic(mlp(act=None), min_size=0)
    x = feeds_for(q)["x"]
    x[2, 5] = np.nan
    run = bz.compile(q) if compiled else (lambda f: bz.interpret(q, f))
    with np.errstate(invalid="ignore"):
        out = run({"x": x})[0]
    assert np.isnan(out[2]).all() and np.isfinite(np.delete(out, 2, axis=0)).all()


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("bad", [np.inf, -np.inf])
def test_an_infinity_in_a_row_gives_that_row_nans(compiled, bad):
    """A row's scale is infinite then, so its values dequantize to 0 * inf: NaN, in the kernel
    as in the decomposition (the kernel read -min / scale = NaN as the zero point, INT_MIN,
    and gave a mixture of +-inf and NaN)."""
    g = bz.Graph("linear")
    w = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    g.set_outputs([g.mm(g.input("x", bz.Shape((6, 64))), g.param("w", bz.Shape((64, 48)),
                                                                  value=w))])
    q, _ = bz.quantize_dynamic(g, min_size=0)
    x = feeds_for(q)["x"]
    x[2, 5] = bad
    run = bz.compile(q) if compiled else (lambda f: bz.interpret(q, f))
    with np.errstate(invalid="ignore"):
        out = run({"x": x})[0]
    assert np.isnan(out[2]).all() and np.isfinite(np.delete(out, 2, axis=0)).all()


def test_fuse_unfuse_round_trip_keeps_the_numbers():
    q, _ = bz.quantize_dynamic(mlp(), min_size=0)
    plain = bz.unfuse_fused_for_autodiff(q)
    assert not any(n.op.fused for n in plain.nodes)
    assert {"quantize", "fake_quantize", "matmul"} & set(plain.op_counts())
    feeds = feeds_for(q)
    np.testing.assert_allclose(bz.interpret(plain, feeds)[0], bz.interpret(q, feeds)[0],
                               rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not int8_gemm.available(), reason="no AVX512-VNNI here")
@pytest.mark.parametrize("threads", [1, 2])
def test_the_cpu_kernel_matches_the_interpreter(threads):
    g = mlp(batch="batch")
    q, _ = bz.quantize_dynamic(g, min_size=0)
    exe = bz.compile(q, threads=threads)
    for batch in (1, 3, 17):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 64), np.float32)}
        assert "int8 GEMM" in str(exe.dispatch_report(feeds))
        want = bz.interpret(q, feeds)[0]
        np.testing.assert_allclose(exe(feeds)[0], want, rtol=1e-5,
                                   atol=1e-5 * np.abs(want).max())


def test_other_targets_decompose_it():
    q, _ = bz.quantize_dynamic(mlp(), min_size=0)
    for target in ("onnxruntime", "gpu"):
        low = bz.rewrite_for_backend(q, target)
        assert "dynamic_quant_matmul" not in low.op_counts(), target
        assert {"quantize", "fake_quantize"} & set(low.op_counts()), target
    assert bz.rewrite_for_backend(q, "cpu").op_counts()["dynamic_quant_matmul"] == 2


def test_given_params_are_quantized_and_stored():
    g = mlp(stored=False)
    values = {p.op.name: np.asarray(v) for p, v in zip(g.params, mlp().weights.values(),
                                                          strict=True)}
    q, report = bz.quantize_dynamic(g, params=values, min_size=0)
    assert q.op_counts()["dynamic_quant_matmul"] == 2 and not report.misses
    assert set(q.weights) >= {"b1", "w1.int8", "w2.int8"}  # compiles without params
    feeds = feeds_for(g)
    np.testing.assert_allclose(bz.interpret(q, feeds)[0], bz.interpret(g, feeds, values)[0],
                               rtol=0.05, atol=0.05)


def test_per_tensor_scales_and_a_shared_weight():
    g = bz.Graph("shared")
    x = g.input("x", bz.Shape((4, 32)))
    w = g.param("w", bz.Shape((32, 32)),
                value=np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32))
    g.set_outputs([g.mm(g.mm(x, w), w)])
    q, _ = bz.quantize_dynamic(g, min_size=0, per_channel=False)
    assert q.op_counts()["dynamic_quant_matmul"] == 2
    assert [p.op.name for p in q.params] == ["w.int8.tensor", "w.scale.tensor"]
    scale = q.weights["w.scale.tensor"]
    assert (scale == scale[0]).all()
    np.testing.assert_array_equal(q.weights["w.int8.tensor"],
                                  quantize_weight(g.weights["w"], per_channel=False)[0])


@pytest.mark.parametrize("taken", ["w.scale", "w.int8"])
def test_a_param_already_named_like_the_int8_weight_or_its_scales_is_left_alone(taken):
    """An unrelated param named w.scale (f32 [N], the scales' very type) was read as w's
    scales: a silently wrong layer; named w.int8, the pass failed."""
    rng = np.random.default_rng(0)
    g = bz.Graph("clash")
    x = g.input("x", bz.Shape((4, 32)))
    w = g.param("w", bz.Shape((32, 16)), value=rng.standard_normal((32, 16), np.float32))
    other = g.param(taken, bz.Shape((16,)), value=np.full(16, 7.0, np.float32))
    g.set_outputs([g.add(g.mm(x, w), other)])
    q, _ = bz.quantize_dynamic(g, min_size=0)
    assert q.op_counts().get("dynamic_quant_matmul") == 1
    np.testing.assert_array_equal(q.weights[taken], np.full(16, 7.0, np.float32))
    feeds = feeds_for(g)
    want = bz.interpret(g, feeds)[0]
    np.testing.assert_allclose(bz.interpret(q, feeds)[0], want, atol=0.05 * np.abs(want).max())


def test_a_transposed_stored_weight_is_quantized():
    """x @ w.T with w stored [N, K] (tied embeddings, [out, in] layouts) was a miss that called
    w.T 'computed when the graph runs'; w stays for its other reader (the embedding gather)."""
    rng = np.random.default_rng(3)
    g = bz.Graph("tied")
    ids = g.input("ids", bz.Shape((5,), bz.i64))
    w = g.param("wte", bz.Shape((40, 32)), value=rng.standard_normal((40, 32), np.float32))
    h = g.gather(w, ids, 0)
    g.set_outputs([g.mm(h, g.transpose(w, (1, 0)))])
    q, report = bz.quantize_dynamic(g, min_size=0)
    assert q.op_counts().get("dynamic_quant_matmul") == 1 and not report.misses
    assert "transpose" not in q.op_counts() and "wte" in q.weights
    assert q.weights["wte.T.int8"].shape == (32, 40)
    feeds = {"ids": np.array([0, 3, 7, 39, 12])}
    want = bz.interpret(g, feeds)[0]
    got = bz.interpret(q, feeds)[0]
    np.testing.assert_allclose(got, want, atol=0.03 * np.abs(want).max())
    np.testing.assert_allclose(bz.compile(q)(feeds)[0], got, rtol=1e-5,
                               atol=1e-5 * np.abs(got).max())


def test_projections_of_one_input_share_one_int8_gemm():
    """Q, K and V (or gate and up) reading one x join first: one GEMM quantizes x once."""
    rng = np.random.default_rng(3)
    g = bz.Graph("qkv")
    x = g.input("x", bz.Shape((5, 64)))
    outs = []
    for name in "qkv":
        w = g.param(f"{name}.w", bz.Shape((64, 64)),
                    value=rng.standard_normal((64, 64)).astype(np.float32))
        b = g.param(f"{name}.b", bz.Shape((64,)), value=rng.standard_normal(64).astype(np.float32))
        outs.append(g.add(g.mm(x, w), b))
    g.set_outputs(outs)
    q, _ = bz.quantize_dynamic(g, min_size=0)
    assert q.op_counts()["dynamic_quant_matmul"] == 1 and q.op_counts()["narrow"] == 3
    feeds = feeds_for(g)
    for got, want in zip(bz.interpret(q, feeds), bz.interpret(g, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05 * np.abs(want).max())


# -- must not fire: each with its reason in the report -------------------------------------------
def test_a_weight_without_a_value_is_reported():
    q, report = bz.quantize_dynamic(mlp(stored=False), min_size=0)
    assert "dynamic_quant_matmul" not in q.op_counts()
    (miss, _) = misses(report, MissReason.WEIGHT_NOT_CONSTANT)
    assert "no stored value" in miss.detail and "params=" in miss.hint


def test_a_product_of_two_activations_is_reported():
    g = bz.Graph("scores")
    a = g.input("a", bz.Shape((4, 64, 64)))
    b = g.input("b", bz.Shape((64, 64)))
    g.set_outputs([g.mm(a, b)])
    q, report = bz.quantize_dynamic(g, min_size=0)
    assert q.op_counts() == g.op_counts()
    (miss,) = misses(report, MissReason.WEIGHT_NOT_CONSTANT)
    assert "computed when the graph runs" in miss.detail and "stays float32" in miss.hint


def test_a_batched_weight_is_reported():
    g = bz.Graph("batched")
    x = g.input("x", bz.Shape((2, 4, 64)))
    w = g.param("w", bz.Shape((2, 64, 64)), value=np.ones((2, 64, 64), np.float32))
    g.set_outputs([g.mm(x, w)])
    _, report = bz.quantize_dynamic(g, min_size=0)
    (miss,) = misses(report, MissReason.SHAPE_MISMATCH)
    assert "not 2-D" in miss.detail


def test_a_small_weight_is_reported():
    q, report = bz.quantize_dynamic(mlp(), min_size=7000)   # w1 64 x 128, w2 128 x 48
    assert q.op_counts()["dynamic_quant_matmul"] == 1 and "w2" in q.weights
    (miss,) = misses(report, MissReason.BELOW_MIN_SIZE)
    assert "6144 < min_size 7000" in miss.detail


def test_a_half_precision_matmul_is_reported():
    g = bz.Graph("half")
    x = g.input("x", bz.Shape((4, 64), bz.f16))
    w = g.param("w", bz.Shape((64, 64), bz.f16), value=np.ones((64, 64), np.float16))
    g.set_outputs([g.mm(x, w)])
    q, report = bz.quantize_dynamic(g, min_size=0)
    assert "dynamic_quant_matmul" not in q.op_counts()
    assert misses(report, MissReason.DTYPE_MISMATCH)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_weight_holding_nan_or_infinity_is_reported(bad):
    g = mlp()
    w = np.array(g.weights["w1"])
    w[3, 4] = bad
    q, report = bz.quantize_dynamic(g, params={"w1": w}, min_size=0)
    assert q.op_counts()["dynamic_quant_matmul"] == 1   # w2 only
    (miss,) = misses(report, MissReason.DTYPE_MISMATCH)
    assert "NaN or infinite" in miss.detail


def test_an_empty_weight_is_reported():
    g = bz.Graph("empty")
    x = g.input("x", bz.Shape((4, 0)))
    g.set_outputs([g.mm(x, g.param("w", bz.Shape((0, 8)), value=np.zeros((0, 8), np.float32)))])
    q, report = bz.quantize_dynamic(g, min_size=0)
    assert "dynamic_quant_matmul" not in q.op_counts()
    (miss,) = misses(report, MissReason.SHAPE_MISMATCH)
    assert "empty" in miss.detail


def test_weights_inside_fused_nodes_are_reported():
    """A graph fused before quantizing holds projections inside fused attention blocks: they
    stay float32, and the report says so (it said nothing: 'misses 0')."""
    g = bz.models.build_model("bert-tiny")
    fused, _ = bz.fuse(g, target="cpu")
    assert fused.op_counts().get("fused_attention_block")
    q, report = bz.quantize_dynamic(fused, params=bz.init_params(g, seed=0), min_size=0)
    assert q.op_counts().get("dynamic_quant_matmul")
    inside = [m for m in report.misses if "fused_attention_block" in (m.detail or "")]
    assert len(inside) == fused.op_counts()["fused_attention_block"]
    assert all(m.reason is MissReason.PATTERN_MISMATCH and "before bz.fuse" in m.hint
               for m in inside)


def test_a_kind_left_out_of_op_kinds_is_reported():
    q, report = bz.quantize_dynamic(mlp(), min_size=0, op_kinds=("fused_matmul_bias_act",))
    assert q.op_counts()["dynamic_quant_matmul"] == 1   # the biased layer; the plain matmul not
    (miss,) = misses(report, MissReason.DISABLED)
    assert "leaves out matmul" in miss.detail


def test_bad_arguments_are_refused():
    g = mlp()
    with pytest.raises(BrazeError, match="weight_dtype"):
        bz.quantize_dynamic(g, weight_dtype=bz.u8)
    with pytest.raises(BrazeError, match="op_kinds"):
        bz.quantize_dynamic(g, op_kinds=("conv2d",))
    with pytest.raises(GraphError, match="not params"):
        bz.quantize_dynamic(g, params={"nope": np.zeros(3, np.float32)})


def test_gradient_is_straight_through():
    """d loss / d x of the quantized graph equals that of the float graph on the dequantized
    weights: fake_quantize passes the cotangent of every row through."""
    g = mlp(act="tanh")
    q, _ = bz.quantize_dynamic(g, min_size=0)
    ref = bz.Graph("ref")
    x = ref.input("x", bz.Shape((6, 64)))
    w = {n: q.weights[f"{n}.int8"].astype(np.float32) * q.weights[f"{n}.scale"]
         for n in ("w1", "w2")}
    h = ref.tanh(ref.add(ref.mm(x, ref.constant(w["w1"])), ref.constant(g.weights["b1"])))
    ref.set_outputs([ref.mm(h, ref.constant(w["w2"]))])

    def grad(graph):
        loss = bz.Graph("loss")
        from braze.autodiff.reverse import clone_into

        out = clone_into(loss, graph)[graph.outputs[0]]
        loss.set_outputs([loss.sum(loss.mul(out, out))])
        loss.weights = graph.weights.copy()
        return bz.grad_with_loss(loss, ["x"])

    feeds = feeds_for(g)
    got = bz.interpret(grad(q), feeds)[1]
    # the forward values differ by the quantization of h; compare at the quantized forward
    assert np.isfinite(got).all() and np.abs(got).max() > 0
    want = bz.interpret(grad(ref), feeds)[1]
    np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05 * np.abs(want).max())
