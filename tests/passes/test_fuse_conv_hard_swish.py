"""FuseConvBiasAct with a hard-swish epilogue written in primitives (every way exporters write
it), and a bias that is a reshaped [C] vector: fires, must-not-fire with the reason, numerics,
unfuse round trip."""
import numpy as np
import pytest

import braze as bz
from braze.passes.base import RulePass, run_passes
from braze.passes.cleanup import DCE_PASS
from braze.passes.fusion import conv_bias_act
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
FUSE = RulePass("FuseConvBiasAct", conv_bias_act.RULES)


def c(g, v):
    return g.constant(np.float32(v))


FORMS = {
    "paddle": lambda g, y: g.div(g.mul(y, g.clamp(g.add(y, c(g, 3)), 0.0, 6.0)), c(g, 6)),
    "paddle_mul_sixth": lambda g, y: g.mul(g.mul(g.clamp(g.add(c(g, 3), y), 0.0, 6.0), y),
                                           c(g, 1 / 6)),
    "gate_div": lambda g, y: g.mul(y, g.div(g.clamp(g.add(y, c(g, 3)), 0.0, 6.0), c(g, 6))),
    "gate_mul": lambda g, y: g.mul(g.mul(g.clamp(g.add(y, c(g, 3)), 0.0, 6.0), c(g, 1 / 6)), y),
    "hard_sigmoid": lambda g, y: g.mul(y, g.clamp(g.add(g.mul(y, c(g, 1 / 6)), c(g, 0.5)),
                                                  0.0, 1.0)),
    "paddle_alpha": lambda g, y: g.mul(y, g.clamp(g.add(g.mul(c(g, 0.1666667), y), c(g, 0.5)),
                                                  0.0, 1.0)),
}


def conv_graph(act, bias="added", conv_bias=False):
    g = bz.Graph("conv_hswish")
    x = g.input("x", bz.Shape(("batch", 4, 6, 6)))
    w = g.param("w", bz.Shape((6, 4, 3, 3)))
    cb = g.param("cb", bz.Shape((6,))) if conv_bias else None
    y = g.conv2d(x, w, cb, padding=1)
    if bias == "added":
        y = g.add(y, g.param("b", bz.Shape((1, 6, 1, 1))))
    elif bias == "reshaped":
        y = g.add(y, g.reshape(g.param("b", bz.Shape((6,))), (1, 6, 1, 1)))
    g.set_outputs([act(g, y)])
    return g


def fused_node(g):
    (node,) = [n for n in g.nodes if n.op.kind == "fused_conv_bias_act"]
    return node


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("bias,conv_bias", [("added", False), (None, True), (None, False),
                                            ("added", True)])
def test_every_written_form_of_hard_swish_joins_the_conv(form, bias, conv_bias):
    g = conv_graph(FORMS[form], bias, conv_bias)
    res = FUSE.run(g, CPU)
    counts = res.graph.op_counts()
    assert counts.pop("fused_conv_bias_act") == 1
    want = {"reshape": 1} if bias else {}  # the [1, 6, 1, 1] bias as [6] ...
    if bias and conv_bias:
        want["add"] = 1  # ... plus the conv's own [6] bias
    assert counts == want
    assert fused_node(res.graph).op.act is bz.UnaryFn.HARD_SWISH
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


def test_hard_swish_reference_is_x_relu6_x_plus_3_over_6():
    x = np.linspace(-5, 5, 41, dtype=np.float32)
    got = bz.Graph("h")
    v = got.input("x", bz.Shape((41,)))
    got.set_outputs([got.activation(v, "hard_swish")])
    np.testing.assert_allclose(bz.interpret(got, {"x": x})[0],
                               x * np.clip(x + 3, 0, 6) / 6, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("wrong", ["three", "six"])
def test_wrong_constants_are_not_hard_swish_and_say_so(wrong):
    three, six = (2.5 if wrong == "three" else 3.0), (5.0 if wrong == "six" else 6.0)

    def act(g, y):
        return g.div(g.mul(y, g.clamp(g.add(y, c(g, three)), 0.0, 6.0)), c(g, six))

    g = conv_graph(act)
    res = FUSE.run(g, CPU)
    node = fused_node(res.graph)
    assert node.op.act is None  # conv + bias still fuse; the expression stays outside
    assert res.graph.count("clamp") == 1
    assert MissReason.PATTERN_MISMATCH in {m.reason for m in res.misses}
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


def test_target_without_hard_swish_epilogue_keeps_it_outside_with_a_miss():
    target = TARGETS["cpu"].with_options(epilogue_activations=frozenset({bz.UnaryFn.RELU}))
    g = conv_graph(FORMS["paddle"])
    res = FUSE.run(g, RewriteContext(target=target))
    assert fused_node(res.graph).op.act is None and res.graph.count("clamp") == 1
    assert [m.reason for m in res.misses] == [MissReason.UNSUPPORTED_EPILOGUE_ACTIVATION]
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


def test_a_pre_activation_read_elsewhere_keeps_the_activation_outside():
    g = bz.Graph("two_readers")
    x = g.input("x", bz.Shape((1, 4, 6, 6)))
    y = g.add(g.conv2d(x, g.param("w", bz.Shape((6, 4, 3, 3)))),
              g.param("b", bz.Shape((6, 1, 1))))
    g.set_outputs([FORMS["paddle"](g, y), g.neg(y)])
    res = FUSE.run(g, CPU)
    assert fused_node(res.graph).op.act is None and res.graph.count("clamp") == 1
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


def test_a_reshaped_channel_vector_bias_is_used_as_is():
    g = conv_graph(FORMS["hard_sigmoid"], bias="reshaped")
    fused, _ = run_passes(g, [FUSE, DCE_PASS], CPU)
    assert fused.op_counts() == {"fused_conv_bias_act": 1}  # no reshape back and forth
    bias = fused.node(fused_node(fused).inputs[2])
    assert bias.op.kind == "param" and bias.op.name == "b"
    assert_equivalent(g, fused, rtol=1e-5, atol=1e-5)


def test_hard_swish_unfuse_round_trip():
    g = conv_graph(FORMS["gate_div"], conv_bias=True)
    fused, _ = run_passes(g, [FUSE], CPU, verify=True, check_numerics=True)
    plain = unfuse_fused_for_autodiff(fused)
    assert plain.count("fused_conv_bias_act") == 0 and plain.count("hard_swish") == 1
    assert_equivalent(g, plain, rtol=1e-5, atol=1e-5)
