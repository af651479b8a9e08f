"""Convolutions under the bf16 policy (kernels/conv_amx.py, kernels/conv_dp.py): a conv with a
static weight and a rounded input runs as an implicit GEMM on AMX tiles or AVX512-BF16 dot
products (each engine this CPU has, the other set aside), reading the unrounded input (the
rounding casts are done inside it); odd sizes, strides, padding, dilation, 1x1, a 7x7 of 6
channels, groups of whole 32-channel blocks, every epilogue (bias, activations, a residual).
Checked against the reference interpreter on the policy's graph (`exe.graph`); depthwise and
other grouped convs and weights fed at run time keep the f32 kernels, and the fp32 compile
never takes this path."""
import dataclasses

import numpy as np
import pytest

import braze as bz
from braze.models import resnet_basic_block
from braze.runtime.kernels import conv_amx, conv_dp, conv_native

pytestmark = pytest.mark.skipif(conv_native.lib() is None, reason="no C compiler here")
NAMES = {"amx": "AMX conv", "dp": "AVX512-BF16 conv"}


@pytest.fixture(params=["amx", "dp"])
def engine(request, monkeypatch):
    """Each bf16 conv engine this CPU has (AMX set aside for the AVX512-BF16 one); its name in
    dispatch reports."""
    if request.param == "amx" and conv_amx.lib() is None:
        pytest.skip("no AMX tiles (or no permission for them) here")
    if request.param == "dp":
        if conv_dp.lib() is None:
            pytest.skip("no AVX512-BF16 here")
        monkeypatch.setattr(conv_amx, "AMX", dataclasses.replace(conv_amx.AMX,
                                                                   lib=lambda: None))
    return NAMES[request.param]


def _conv(n, c, h, w, o, k, *, stride=1, padding=0, dilation=1, groups=1, act=None,
          residual=False, weight_input=False):
    g = bz.Graph("conv_bf16")
    x = g.input("x", bz.Shape((n, c, h, w)))
    kh, kw = (k, k) if isinstance(k, int) else k
    shape = bz.Shape((o, c // groups, kh, kw))
    wt = g.input("w", shape) if weight_input else g.param("w", shape)
    b = g.param("b", bz.Shape((o,)))
    y = g.conv2d(x, wt, b, stride, padding, dilation, groups)
    if residual:
        y = g.add(y, g.tanh(g.input("r", g.shape_of(y))))
    if act is not None:
        y = g.activation(y, act)
    g.set_outputs([y])
    return g


def _run(g, seeds=(0, 1)):
    """Compile under the bf16 policy and check it against the interpreter on the policy's
    graph; (dispatch report rows, executable)."""
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, precision="bf16")
    for seed in seeds:
        feeds = bz.random_feeds(g, seed)
        want = bz.interpret(exe.graph, feeds, params)[0]
        got = exe(feeds)[0]
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(got - want).max() < 2e-3 * scale
        assert np.mean(np.abs(got - want) <= 1e-3 * np.abs(want) + 1e-4 * scale) > 0.99
    return exe.dispatch_report().rows, exe


CASES = {
    "3x3 same": (1, 30, 9, 11, 24, 3, dict(padding=1)),
    "stride 2, asymmetric pad": (2, 40, 13, 9, 8, 3, dict(stride=2, padding=(0, 1, 1, 0))),
    "dilation 2, rect": (1, 45, 15, 11, 7, (3, 2), dict(padding=2, dilation=2)),
    "1x1": (2, 260, 7, 9, 33, 1, dict()),
    "1x1 stride 2": (1, 300, 9, 7, 20, 1, dict(stride=2)),
    "7x7 stride 2, 6 channels": (1, 6, 30, 26, 16, 7, dict(stride=2, padding=3)),
    "5x5, 11 channels (odd), 70 outputs": (1, 11, 12, 10, 70, 5, dict(padding=2)),
    "groups of 32 channels": (2, 64, 9, 10, 48, 3, dict(padding=1, groups=2)),
    "groups of 64, stride 2": (1, 256, 10, 9, 100, 3, dict(stride=2, padding=1, groups=4)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("act, residual", [(None, False), ("relu", False), ("gelu", False),
                                           ("exp", False), ("relu", True), (None, True)])
def test_convs_run_as_bf16_implicit_gemms_from_the_unrounded_input(case, act, residual,
                                                                    engine):
    n, c, h, w, o, k, attrs = CASES[case]
    rows, _ = _run(_conv(n, c, h, w, o, k, act=act, residual=residual, **attrs))
    convs = [r for r in rows if r[1] in ("conv2d", "fused_conv_bias_act")]
    assert len(convs) == 1 and engine in convs[0][3], convs
    inside = [r for r in rows if r[1] == "cast" and "done inside" in r[3]]
    assert len(inside) == 2  # the input's rounding casts run inside the conv


def test_a_conv_of_few_multiply_adds_per_output_stays_f32(engine):
    """Under precision.MIN_CONV_MACS (kh kw C) the default policy leaves the conv's operands in
    f32 (no casts); a policy rounding every conv runs it on the f32 kernels, rounded."""
    from braze.passes.precision import MIN_CONV_MACS, POLICIES

    g = _conv(1, 24, 9, 8, 12, 1, act="relu")
    assert 24 < MIN_CONV_MACS
    rows, _ = _run(g)
    (conv,) = [r for r in rows if r[1] == "fused_conv_bias_act"]
    assert "bf16" not in conv[3] and not [r for r in rows if r[1] == "cast"]
    every = dataclasses.replace(POLICIES["bf16"], min_conv_macs=0)
    exe = bz.compile(g, params=bz.init_params(g, 0), precision=every)
    feeds = bz.random_feeds(g, 0)
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(exe.graph, feeds,
                                                           bz.init_params(g, 0))[0],
                               rtol=1e-5, atol=1e-5)
    assert any(r[1] == "cast" for r in exe.dispatch_report().rows)


def test_a_1x1_conv_of_96_channels_runs_bf16_and_an_engine_floor_sets_it_aside(engine,
                                                                              monkeypatch):
    """96 multiply-adds per output: the default policy rounds it (MIN_CONV_MACS is 32) and
    the AVX512-BF16 engine runs it (the AMX one only from conv_amx.AMX_MIN_MACS); an engine
    whose floor is above it leaves it to the f32 kernels, on the rounded values."""
    from braze.passes.precision import MIN_CONV_MACS

    g = _conv(2, 96, 7, 9, 40, 1, act="relu")
    assert MIN_CONV_MACS <= 96 < conv_amx.AMX_MIN_MACS
    rows, _ = _run(g)
    (conv,) = [r for r in rows if r[1] == "fused_conv_bias_act"]
    if engine == NAMES["dp"]:
        assert engine in conv[3], conv
        monkeypatch.setattr(conv_dp, "DP", dataclasses.replace(conv_dp.DP, min_macs=128))
    else:
        assert "bf16" not in conv[3] or NAMES["dp"] in conv[3], conv
        monkeypatch.setattr(conv_dp, "DP", dataclasses.replace(conv_dp.DP, lib=lambda: None))
    rows, _ = _run(g)
    (conv,) = [r for r in rows if r[1] == "fused_conv_bias_act"]
    assert "bf16" not in conv[3] and [r for r in rows if r[1] == "cast"], rows


@pytest.mark.parametrize("groups", [2, 6])
def test_grouped_and_depthwise_convs_keep_the_f32_kernels(groups, engine):
    rows, _ = _run(_conv(1, 6, 9, 8, 6, 3, padding=1, groups=groups, act="relu"))
    (conv,) = [r for r in rows if r[1] == "fused_conv_bias_act"]
    assert "bf16" not in conv[3]


def test_a_weight_fed_at_run_time_keeps_the_f32_kernels(engine):
    rows, _ = _run(_conv(1, 40, 9, 8, 12, 3, padding=1, weight_input=True))
    assert [r for r in rows if r[1] == "cast"]  # rounded, by the f32 kernels' casts
    (conv,) = [r for r in rows if r[1] == "fused_conv_bias_act"]
    assert "bf16" not in conv[3]


def test_the_fp32_compile_keeps_the_f32_convs():
    g = _conv(1, 16, 9, 11, 24, 3, padding=1, act="relu")
    exe = bz.compile(g, params=bz.init_params(g, 0))
    exe(bz.random_feeds(g, 0))
    (conv,) = [r for r in exe.dispatch_report().rows if r[1] == "fused_conv_bias_act"]
    assert "bf16" not in conv[3]


def test_resnet_block_under_the_bf16_policy(engine):
    """The builtin ResNet basic block: both convs on the bf16 engine, the residual and ReLU in
    the second one's epilogue, against the policy's reference and within bf16 of fp32."""
    g = resnet_basic_block(seed=0)
    exe = bz.compile(g, precision="bf16")
    feeds = bz.random_feeds(g, 3)
    got = exe(feeds)[0]
    want = bz.interpret(exe.graph, feeds)[0]
    scale = float(np.abs(want).max())
    assert np.abs(got - want).max() < 2e-3 * scale
    f32 = bz.interpret(g, feeds)[0]
    assert np.abs(got - f32).max() < 3e-2 * scale
    convs = [r for r in exe.dispatch_report().rows if r[1] == "fused_conv_bias_act"]
    assert len(convs) == 2 and all(engine in r[3] for r in convs)
    assert any("residual" in r[3] for r in convs)
