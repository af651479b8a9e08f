"""Activations written in primitives become one unary op by probing the function they compute;
a mistyped constant is a reported near miss, and arbitrary math is left alone."""
import numpy as np
import pytest
from helpers import canonicalize, check_same

import braze as bz

C = float(np.sqrt(2.0 / np.pi))


def _gelu_erf(g, x, order):
    if order == 0:
        return g.mul(g.mul(x, 0.5), g.add(g.erf(g.div(x, float(np.sqrt(2.0)))), 1.0))
    return g.mul(g.mul(g.add(g.erf(g.mul(x, float(1 / np.sqrt(2.0)))), 1.0), x), 0.5)


def _gelu_tanh(g, x, form):
    if form == "new":           # gelu_new: pow(x, 3)
        inner = g.mul(g.add(x, g.mul(g.pow(x, 3.0), 0.044715)), C)
    elif form == "pytorch":     # gelu_pytorch_tanh written as x * x * x
        inner = g.mul(g.add(x, g.mul(g.mul(g.mul(x, x), x), 0.044715)), C)
    else:                       # gelu_fast: x * 0.7978845608 * (1 + 0.044715 * x * x)
        inner = g.mul(g.mul(x, 0.7978845608), g.add(g.mul(g.mul(x, x), 0.044715), 1.0))
    return g.mul(g.mul(x, 0.5), g.add(g.tanh(inner), 1.0))


CASES = {
    "gelu_erf_0": (lambda g, x: _gelu_erf(g, x, 0), bz.UnaryFn.GELU),
    "gelu_erf_1": (lambda g, x: _gelu_erf(g, x, 1), bz.UnaryFn.GELU),
    "gelu_new": (lambda g, x: _gelu_tanh(g, x, "new"), bz.UnaryFn.GELU_APPROX),
    "gelu_pytorch_tanh": (lambda g, x: _gelu_tanh(g, x, "pytorch"), bz.UnaryFn.GELU_APPROX),
    "gelu_fast": (lambda g, x: _gelu_tanh(g, x, "fast"), bz.UnaryFn.GELU_APPROX),
    "quick_gelu": (lambda g, x: g.mul(x, g.sigmoid(g.mul(x, 1.702))), bz.UnaryFn.QUICK_GELU),
    "silu": (lambda g, x: g.mul(g.sigmoid(x), x), bz.UnaryFn.SILU),
    "relu": (lambda g, x: g.maximum(x, 0.0), bz.UnaryFn.RELU),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_activation_forms(name):
    build, fn = CASES[name]
    g = bz.Graph(name)
    x = g.input("x", bz.Shape(("b", 16)))
    h = g.add(x, g.param("bias", bz.Shape((16,))))         # the activation's input is computed
    g.set_outputs([build(g, h)])
    out, _ = canonicalize(g)
    assert out.count(fn.value) == 1, out.op_counts()
    assert sum(out.op_counts().values()) == 2              # the bias add and the activation
    check_same(g, out, rtol=1e-5, atol=1e-6)


def test_a_mistyped_constant_is_a_near_miss_with_the_reason():
    g = bz.Graph("typo")
    x = g.input("x", bz.Shape((4, 8)))
    inner = g.mul(g.add(x, g.mul(g.pow(x, 3.0), 0.0447)), C)       # 0.044715 mistyped
    g.set_outputs([g.mul(g.mul(x, 0.5), g.add(g.tanh(inner), 1.0))])
    out, misses = canonicalize(g)
    assert out.count("gelu_approx") == 0 and out.count("tanh") == 1
    (miss,) = [m for m in misses if m.pattern == "CanonicalizeActivation"]
    assert "close to gelu_approx" in miss.detail
    check_same(g, out)


def test_other_math_and_two_input_expressions_are_left_alone():
    g = bz.Graph("other")
    x = g.input("x", bz.Shape((4, 8)))
    y = g.input("y", bz.Shape((4, 8)))
    a = g.mul(g.tanh(x), g.exp(x))                      # smooth, one input, not an activation
    b = g.mul(x, g.sigmoid(y))                          # silu-shaped but two inputs
    g.set_outputs([a, b])
    out, misses = canonicalize(g)
    assert out.op_counts() == g.op_counts()
    assert not [m for m in misses if m.pattern == "CanonicalizeActivation"]


def test_float64_graphs_are_probed_in_their_own_dtype():
    """The probe graph's constants take the cone's dtype (an f64 quick-gelu cone used to build
    an f32 constant against f64 values and stop bz.fuse)."""
    g = bz.Graph("f64")
    x = g.input("x", bz.Shape((5, 7), bz.f64))
    h = g.mm(x, g.param("w", bz.Shape((7, 3), bz.f64)))
    g.set_outputs([g.mul(h, g.sigmoid(g.mul(h, 1.702)))])
    fused, _ = bz.fuse(g, "cpu")
    assert fused.op_counts() == {"fused_matmul_bias_act": 1}
    (node,) = fused.nodes[-1:]
    assert node.op.act.value == "quick_gelu"
    check_same(g, fused)


def test_cones_written_alike_are_probed_once(monkeypatch):
    """Cones with the same ops, wiring and constants are probed once: twelve GELU layers cost
    what one does, and the result (recognized ops, the mistyped cone's near miss) is the one
    probing every cone gives."""
    from braze.passes.canonicalize import activations

    calls = []
    real = activations.interpret
    monkeypatch.setattr(activations, "interpret",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    g = bz.Graph("layers")
    h = g.input("x", bz.Shape(("b", 16)))
    for i in range(12):
        h = g.mm(h, g.param(f"w{i}", bz.Shape((16, 16))))
        h = _gelu_tanh(g, g.add(h, g.param(f"b{i}", bz.Shape((16,)))), "new")
    h = g.mm(h, g.param("w", bz.Shape((16, 16))))
    inner = g.mul(g.add(h, g.mul(g.pow(h, 3.0), 0.0447)), C)   # mistyped: another cone
    g.set_outputs([g.mul(g.mul(h, 0.5), g.add(g.tanh(inner), 1.0))])
    results = []
    for key in (activations._cone_key, lambda *a: None):      # cached, then every cone probed
        monkeypatch.setattr(activations, "_PROBED", {})
        monkeypatch.setattr(activations, "_cone_key", key)
        calls.clear()
        out, misses = canonicalize(g)
        reasons = [m.detail for m in misses if m.pattern == "CanonicalizeActivation"]
        results.append((out, reasons, len(calls)))
    (cached, cached_reasons, n_cached), (probed, probed_reasons, n_probed) = results
    assert cached == probed and cached_reasons == probed_reasons and len(cached_reasons) == 1
    assert cached.count("gelu_approx") == 12 and cached.count("tanh") == 1
    assert n_probed - n_cached >= 11  # the GELUs after the first cost no probe
    check_same(g, cached)


def test_a_constants_kept_key_is_used_for_that_constant_only(monkeypatch):
    """A cone key's constant part is kept per Constant op; an entry left under the same id by
    another op (ids are reused once an op is gone) is not taken: a GELU whose 0.5 is mistyped
    as 0.4 stays unrecognized even when the kept entry claims its constant is 0.5."""
    from braze.passes.canonicalize import activations
    monkeypatch.setattr(activations, "_PROBED", {})
    monkeypatch.setattr(activations, "_CONSTANT_KEYS", {})

    def gelu(half):
        g = bz.Graph(f"gelu_{half}")
        x = g.input("x", bz.Shape((4, 8)))
        g.set_outputs([g.mul(g.mul(x, half), g.add(g.erf(g.div(x, float(np.sqrt(2.0)))), 1.0))])
        (c,) = [n for n in g.nodes if n.op.kind == "constant" and n.op.value == half]
        return g, c

    good, good_half = gelu(0.5)
    assert canonicalize(good)[0].count("gelu") == 1          # its cone's answer is kept
    bad, bad_half = gelu(0.4)
    good_key = activations._constant_key(good, good_half.value)
    activations._CONSTANT_KEYS[id(bad_half.op)] = (object(), good_key)   # a stale entry
    out, _ = canonicalize(bad)
    assert out.count("gelu") == 0 and out.count("erf") == 1
    check_same(bad, out)


@pytest.mark.parametrize("offset", [100.0, 500.0, 5000.0, 5e5])
def test_a_term_that_starts_far_from_zero_is_no_activation(offset):
    """gelu(x) + relu(x - offset) equals GELU wherever |x| < offset: the probes reach |x| 700
    (all finite) and 1e4 / 1e6 (compared where finite), so the hinge shows: the gelu inside
    becomes one, the sum stays a sum (probing |x| <= 60 had made the whole sum one gelu: 150
    where the graph gives 200)."""
    g = bz.Graph("hinge")
    x = g.input("x", bz.Shape((4, 8)))
    h = g.add(x, g.param("bias", bz.Shape((8,))))
    g.set_outputs([g.add(_gelu_erf(g, h, 0), g.maximum(g.sub(h, offset), 0.0))])
    out, _ = canonicalize(g)
    assert out.count("relu") + out.count("maximum") == 1, out.op_counts()
    feeds = {"x": np.full((4, 8), 2 * offset, np.float32)}
    params = bz.init_params(g, 0)
    np.testing.assert_allclose(bz.interpret(out, feeds, params)[0],
                               bz.interpret(g, feeds, params)[0], rtol=1e-6)


def test_a_silu_that_overflows_far_out_is_still_silu():
    """x * exp(x) / (1 + exp(x)) is NaN at x = 1e4 (inf / inf): the far probes are compared only
    where the form is finite, so it still becomes silu."""
    g = bz.Graph("silu_exp")
    x = g.input("x", bz.Shape((4, 8)))
    h = g.add(x, g.param("bias", bz.Shape((8,))))
    e = g.exp(h)
    g.set_outputs([g.div(g.mul(h, e), g.add(e, 1.0))])
    out, _ = canonicalize(g)
    assert out.count("silu") == 1, out.op_counts()


@pytest.mark.parametrize("dtype", [bz.bf16, bz.f16])
def test_activation_probe_on_half_graphs(dtype):
    # np.finfo rejects ml_dtypes.bfloat16: the probe must use ml_dtypes.finfo
    g = bz.Graph("half_silu")
    x = g.input("x", bz.Shape((4, 8), dtype))
    g.set_outputs([g.mul(x, g.sigmoid(x))])
    fused, _ = bz.fuse(g, "cpu")
    bz.verify(fused)
    feeds = {"x": np.linspace(-3, 3, 32).reshape(4, 8).astype(dtype.np)}
    (want,), (got,) = bz.interpret(g, feeds), bz.interpret(fused, feeds)
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [bz.f16, bz.bf16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_half_precision_forms_are_their_activation(name, dtype):
    """A half model's cone is probed at the values its dtype holds (f16 has no -9.95) and its
    constants hold only the dtype's nearest value (an f16 export divides by 1.4140625): every
    form still becomes its activation."""
    build, fn = CASES[name]
    g = bz.Graph(name)
    x = g.input("x", bz.Shape(("b", 16), dtype))
    g.set_outputs([build(g, x)])
    out, misses = canonicalize(g)
    assert out.count(fn.value) == 1 and not misses, (out.op_counts(), misses)


@pytest.mark.parametrize("const", [1.72, 1.4140625 + 2.0 ** -10])
def test_a_half_constant_a_step_off_is_no_activation(const):
    """quick_gelu's 1.702 mistyped, or f16's sqrt(2) one step off: a near miss, in f16 too."""
    g = bz.Graph("typo16")
    x = g.input("x", bz.Shape((4, 8), bz.f16))
    if const == 1.72:
        y = g.mul(x, g.sigmoid(g.mul(x, const)))
    else:
        y = g.mul(g.mul(x, 0.5), g.add(g.erf(g.div(x, const)), 1.0))
    g.set_outputs([y])
    out, misses = canonicalize(g)
    assert out.count("quick_gelu") == out.count("gelu") == 0
    assert [m.pattern for m in misses] == ["CanonicalizeActivation"]


@pytest.mark.parametrize("eps", [1e-8, 1e-12, -1e-9, -0.0])
def test_a_max_with_a_small_constant_is_no_relu(eps):
    """max(x, eps) guards a log or a division: it differs from relu by eps only, within the
    probes' tolerance, but it is no relu (relu gave 1 / 0 = inf where the graph gives
    1 / eps; max(x, -0.0) gives -0.0 where relu gives 0.0: -inf, not inf): a cone with a
    max must match exactly, zeros' signs included."""
    g = bz.Graph("eps_clamp")
    x = g.input("x", bz.Shape((4, 8)))
    g.set_outputs([g.div(1.0, g.maximum(x, eps))])
    out, _ = canonicalize(g)
    assert out.count("relu") == 0, out.op_counts()
    feeds = {"x": np.full((4, 8), -2.0, np.float32)}
    want = bz.interpret(g, feeds)[0]
    np.testing.assert_array_equal(bz.interpret(out, feeds)[0], want)
    fused, _ = bz.fuse(g)
    np.testing.assert_array_equal(bz.interpret(fused, feeds)[0], want)


@pytest.mark.parametrize("form", ["sigmoid", "primitives", "silu"])
def test_an_epsilon_added_to_an_activation_is_kept(form):
    """log(sigmoid(x) + 1e-8) is how losses keep a log finite: sigmoid + 1e-8 is within the
    probes' tolerance of sigmoid (absolute near zero), but dropping the epsilon gave log of
    sigmoid(-100) = -100 where the graph gives -18.4."""
    g = bz.Graph("eps")
    x = g.input("x", bz.Shape((4,)))
    if form == "sigmoid":
        h = g.add(g.sigmoid(x), 1e-8)
    elif form == "primitives":
        h = g.add(g.div(1.0, g.add(g.exp(g.neg(x)), 1.0)), 1e-7)
    else:
        h = g.add(g.mul(x, g.sigmoid(x)), 1e-7)
    g.set_outputs([g.log(g.abs(h))])
    out, _ = canonicalize(g)
    feeds = {"x": np.array([-100.0, -30.0, 0.0, 2.0], np.float32)}
    np.testing.assert_allclose(bz.interpret(out, feeds)[0], bz.interpret(g, feeds)[0],
                               rtol=1e-5)
