"""ElementwiseRegion: a body graph as one fused op. Inference re-derives shapes from the actual
inputs, the reference and the inlined decomposition match NumPy, and equality is by contents."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.region import ElementwiseRegion

RNG = np.random.default_rng(3)


def gelu_bias_body(act="gelu", dims=(4, 8)):
    """in0 [4, 8] + in1 [8] -> act(.) and, as a second output, the sum times 0.5."""
    body = bz.Graph("body")
    a = body.input("in0", bz.Shape(dims))
    b = body.input("in1", bz.Shape(dims[-1:]))
    s = body.add(a, b)
    body.set_outputs([body.activation(s, act), body.mul(s, 0.5)])
    return body


def silu_mul_body():
    body = bz.Graph("body")
    a, b = body.input("in0", bz.Shape((4, 8))), body.input("in1", bz.Shape((8,)))
    body.set_outputs([body.mul(body.silu(a), b)])
    return body


def test_steps_inputs_and_outputs_come_from_the_body():
    region = ElementwiseRegion(gelu_bias_body())
    assert region.n_inputs == 2 and region.n_outputs == 2
    assert [n.op.label for n in region.steps] == ["add", "gelu", "mul"]
    assert region.fused and region.composite and region.kind == "elementwise_region"


def test_infer_reruns_body_inference_on_symbolic_inputs():
    region = ElementwiseRegion(gelu_bias_body())
    outs = region.infer((bz.Shape(("batch", "seq", 8)), bz.Shape((8,))))
    assert [o.dims for o in outs] == [("batch", "seq", 8)] * 2
    with pytest.raises(bz.ShapeError, match="f32"):
        region.infer((bz.Shape((4, 8), bz.f64), bz.Shape((8,), bz.f64)))
    with pytest.raises(bz.ShapeError, match="broadcast"):
        region.infer((bz.Shape((4, 8)), bz.Shape((5,))))
    with pytest.raises(bz.ShapeError, match="takes 2 inputs"):
        region.infer((bz.Shape((4, 8)),))


def test_reference_and_inlined_decomposition_match_numpy():
    g = bz.Graph("m")
    x = g.input("x", bz.Shape(("batch", 8)))
    bias = g.param("bias", bz.Shape((8,)))
    y, half = g.elementwise_region(gelu_bias_body("relu"), [x, bias])
    g.set_outputs([y, half])
    assert g.shape_of(y).dims == ("batch", 8)

    xs = RNG.standard_normal((5, 8)).astype(np.float32)
    bs = RNG.standard_normal(8).astype(np.float32)
    got = bz.interpret(g, {"x": xs}, {"bias": bs})
    want = [np.maximum(xs + bs, 0), (xs + bs) * 0.5]

    flat = bz.Graph("flat")
    fx = flat.input("x", bz.Shape(("batch", 8)))
    fb = flat.param("bias", bz.Shape((8,)))
    outs = g.node(y).op.decompose(flat, [fx, fb])
    flat.set_outputs(list(outs))
    assert flat.count(ElementwiseRegion) == 0 and flat.count("relu") == 1
    inlined = bz.interpret(flat, {"x": xs}, {"bias": bs})
    for a, b, c in zip(got, inlined, want):
        np.testing.assert_allclose(a, c, rtol=1e-6)
        np.testing.assert_allclose(b, c, rtol=1e-6)


def test_regions_are_equal_by_contents_not_by_length():
    a, b = ElementwiseRegion(gelu_bias_body()), ElementwiseRegion(gelu_bias_body())
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    same_length = ElementwiseRegion(gelu_bias_body("silu"))
    assert len(same_length.steps) == len(a.steps)
    assert a != same_length
    assert ElementwiseRegion(gelu_bias_body(dims=(2, 8))) != a  # shapes are part of identity
    assert ElementwiseRegion(silu_mul_body()) != ElementwiseRegion(gelu_bias_body())


def test_wiring_is_part_of_identity():
    def body(swap):
        g = bz.Graph("body")
        a, b = g.input("in0", bz.Shape((8,))), g.input("in1", bz.Shape((8,)))
        g.set_outputs([g.sub(b, a) if swap else g.sub(a, b)])
        return g

    assert ElementwiseRegion(body(False)) == ElementwiseRegion(body(False))
    assert ElementwiseRegion(body(False)) != ElementwiseRegion(body(True))


def test_body_must_name_inputs_in_order_and_hold_only_elementwise_ops():
    bad = bz.Graph("body")
    x = bad.input("x", bz.Shape((4,)))
    bad.set_outputs([bad.exp(x)])
    with pytest.raises(bz.GraphError, match="in0"):
        ElementwiseRegion(bad)
    mm = bz.Graph("body")
    a = mm.input("in0", bz.Shape((4, 4)))
    mm.set_outputs([mm.matmul(a, a)])
    with pytest.raises(bz.GraphError, match="not elementwise"):
        ElementwiseRegion(mm)


def test_a_body_converts_a_bf16_array_fed_to_its_float_input():
    """A body's float input takes any float array, bf16 too (NumPy kind 'V'), as f16 was."""
    import ml_dtypes

    from braze.ir.ops._body import run_body

    body = bz.Graph("body")
    body.set_outputs([body.tanh(body.input("x", bz.Shape((3,), bz.f32)))])
    for dt in (np.float16, ml_dtypes.bfloat16):
        (y,) = run_body(body, [np.ones(3, dt)])
        assert y.dtype == np.float32 and np.allclose(y, np.tanh(1.0))
