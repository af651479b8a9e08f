"""Channels-last activations (runtime/layout.py): a conv's output that only convs read, as their
input or residual, is kept NHWC between them, in fp32 (braze's NHWC f32 conv) and under the
bf16 policy (the bf16 conv engines, reading it through the policy's rounding). Checked against
the reference interpreter on fresh random inputs and against the all-NCHW program
(`BRAZE_CHANNELS_LAST=0`); values that are graph outputs or that other ops read stay NCHW; a
step that cannot take NHWC makes the program rebuild all NCHW."""
import re

import numpy as np
import pytest

import braze as bz
import braze.runtime.layout as layout
from braze.runtime.kernels import conv_dp, conv_native, conv_nhwc

pytestmark = pytest.mark.skipif(conv_native.lib() is None or conv_nhwc.lib() is None,
                                reason="no C compiler or no AVX-512 here")
CONV_KINDS = ("conv2d", "fused_conv_bias_act")


@pytest.fixture(autouse=True)
def small_convs_take_nhwc(monkeypatch):
    """These graphs are small: let every conv take NHWC (one test restores the limit)."""
    monkeypatch.setattr(conv_nhwc, "MIN_MACS", 0)


class Builder:
    """A graph of convs with seeded params."""

    def __init__(self, n: int, c: int, h: int, w: int):
        self.g = bz.Graph("channels_last")
        self.x = self.g.input("x", bz.Shape((n, c, h, w)))
        self.count = 0

    def conv(self, v, o, k, *, stride=1, padding=0, dilation=1, groups=1, act=None, res=None):
        g = self.g
        self.count += 1
        c = g.shape_of(v).dims[1]
        wt = g.param(f"w{self.count}", bz.Shape((o, c // groups, k, k)))
        b = g.param(f"b{self.count}", bz.Shape((o,)))
        y = g.conv2d(v, wt, b, stride, padding, dilation, groups)
        if res is not None:
            y = g.add(y, res)
        return y if act is None else g.activation(y, act)


def _chain(mid: int, n: int = 1) -> bz.Graph:
    """input -> 3x3 -> 1x1 -> 3x3 stride 2 -> 1x1 + residual -> 5x5 dilated -> output: every
    value between two convs can be NHWC."""
    b = Builder(n, 24, 13, 11)
    a = b.conv(b.x, mid, 3, padding=1, act="relu")
    a = b.conv(a, mid, 1, act="relu")
    s = b.conv(a, mid, 3, stride=2, padding=1)
    d = b.conv(s, mid, 1, res=s, act="relu")
    b.g.set_outputs([b.conv(d, 20, 5, padding=4, dilation=2)])
    return b.g


def _layouts(exe) -> list[str]:
    """Per conv step in order, which of its arrays are NHWC ('' for none), as its dispatch
    report row names them."""
    out = []
    for _, kind, _, name in exe.dispatch_report().rows:
        if kind in CONV_KINDS:
            m = re.search(r", NHWC ([a-z /]+?) \(", name)
            out.append(m.group(1) if m else "")
    return out


def _compile(g, precision, monkeypatch, channels_last: bool):
    """Compiled, its program built (the switch is read when a program is planned)."""
    monkeypatch.setenv("BRAZE_CHANNELS_LAST", "1" if channels_last else "0")
    exe = bz.compile(g, params=bz.init_params(g, 0), precision=precision)
    exe(bz.random_feeds(g, 9))
    return exe


def _check(exe, g, seeds=(0, 1)):
    """The executable against the interpreter on its own (policy) graph."""
    params = bz.init_params(g, 0)
    for seed in seeds:
        feeds = bz.random_feeds(g, seed)
        want = bz.interpret(exe.graph, feeds, params)
        for got, ref in zip(exe(feeds), want, strict=True):
            scale = max(1.0, float(np.abs(ref).max()))
            tol = 1e-5 if exe.precision is None else 2e-3
            assert np.abs(got - ref).max() < tol * scale


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("mid", [40, 37])  # 37: odd channels (the bf16 copy pads them to 38)
def test_a_conv_chain_keeps_its_activations_nhwc(precision, mid, monkeypatch):
    g = _chain(mid, n=2)
    exe = _compile(g, precision, monkeypatch, True)
    _check(exe, g)
    assert _layouts(exe) == ["output", "input / output", "input / output",
                             "input / output / residual", "input"]
    feeds = bz.random_feeds(g, 5)
    nchw = _compile(g, precision, monkeypatch, False)
    assert all(lay == "" for lay in _layouts(nchw))
    got, want = exe(feeds)[0], nchw(feeds)[0]
    scale = float(np.abs(want).max())
    assert np.abs(got - want).max() < (1e-5 if precision is None else 2e-3) * scale


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_convs_whose_weight_outweighs_the_image_go_unit_by_unit(precision, monkeypatch):
    """Two images of 9 x 10 through 3x3 and 1x1 convs of 150-200 channels: each weight is
    larger than an image's input, so the tiles go unit (64 output channels) by unit
    (NHWC_CONV's units-outer order), over two tiles per image and a partial last unit."""
    b = Builder(2, 72, 9, 10)
    a = b.conv(b.x, 200, 3, padding=1, act="relu")
    a = b.conv(a, 150, 1, act="relu")
    d = b.conv(a, 150, 3, padding=1, res=a)
    b.g.set_outputs([b.conv(d, 16, 1, act="relu")])
    exe = _compile(b.g, precision, monkeypatch, True)
    assert _layouts(exe) == ["output", "input / output", "input / output / residual", "input"]
    _check(exe, b.g, seeds=(0, 1, 2))
    feeds = bz.random_feeds(b.g, 4)
    nchw = _compile(b.g, precision, monkeypatch, False)
    got, want = exe(feeds)[0], nchw(feeds)[0]
    assert np.abs(got - want).max() < (1e-5 if precision is None else 2e-3) * np.abs(want).max()


@pytest.mark.skipif(conv_dp.lib() is None, reason="no AVX512-BF16 here")
def test_bf16_engine_chains_are_bit_equal_to_nchw(monkeypatch):
    """Every conv on the AVX512-BF16 engine (channels enough for the policy's 1x1s): the
    layouts change where values live, not one sum."""
    b = Builder(1, 32, 9, 10)
    a = b.conv(b.x, 264, 3, padding=1, act="relu")
    a = b.conv(a, 264, 1, act="relu")
    d = b.conv(a, 264, 1, res=a)
    b.g.set_outputs([b.conv(d, 16, 3, stride=2, padding=1, act="relu")])
    exe = _compile(b.g, "bf16", monkeypatch, True)
    names = [r[3] for r in exe.dispatch_report().rows if r[1] in CONV_KINDS]
    assert all("AVX512-BF16" in name for name in names), names
    assert _layouts(exe) == ["output", "input / output", "input / output / residual", "input"]
    nchw = _compile(b.g, "bf16", monkeypatch, False)
    for seed in (0, 1):
        feeds = bz.random_feeds(b.g, seed)
        np.testing.assert_array_equal(exe(feeds)[0], nchw(feeds)[0])
    _check(exe, b.g)


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_values_other_steps_read_or_the_graph_returns_stay_nchw(precision, monkeypatch):
    b = Builder(1, 24, 12, 10)
    a = b.conv(b.x, 40, 3, padding=1, act="relu")        # also a graph output
    p = b.conv(a, 40, 3, padding=1, act="relu")          # also read by an average pool
    q = b.g.avg_pool2d(p, (2, 2), (2, 2))
    t = b.conv(p, 40, 1, act="relu")                     # also read by tanh
    y = b.conv(t, 16, 3, padding=1)
    b.g.set_outputs([a, b.g.add(b.g.tanh(t), t), y, q])
    exe = _compile(b.g, precision, monkeypatch, True)
    _check(exe, b.g)
    assert all("output" not in lay for lay in _layouts(exe))


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_residuals_in_the_other_layout_join_in_the_tile(precision, monkeypatch):
    """A residual fed NCHW into a conv with an NHWC output, and an NHWC residual into a conv
    whose output (a graph output) is NCHW."""
    b = Builder(1, 24, 11, 9)
    r = b.g.input("r", bz.Shape((1, 40, 11, 9)))
    a = b.conv(b.x, 40, 3, padding=1, act="relu")
    m = b.conv(a, 40, 3, padding=1, res=r, act="relu")   # residual NCHW, output NHWC
    k = b.conv(m, 40, 3, padding=1, act="relu")
    b.g.set_outputs([b.conv(k, 40, 3, padding=1, res=m)])  # residual NHWC, output NCHW
    exe = _compile(b.g, precision, monkeypatch, True)
    _check(exe, b.g)
    assert _layouts(exe) == ["output", "input / output", "input / output",
                             "input / residual"]


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_max_pools_and_the_global_average_pool_take_nhwc(precision, monkeypatch):
    """ResNet's stem -> max pool -> convs -> global average pool, all NHWC in between (a
    padded 3x3 stride-2 pool)."""
    b = Builder(2, 3, 23, 19)
    a = b.conv(b.x, 40, 7, stride=2, padding=3, act="relu")
    m = b.g.max_pool2d(a, (3, 3), (2, 2), 1)
    c = b.conv(m, 40, 3, padding=1, act="relu")
    m2 = b.g.max_pool2d(c, (2, 2), (2, 2))               # NHWC in, NCHW out (graph output)
    d = b.conv(c, 40, 3, padding=1, res=c, act="relu")
    b.g.set_outputs([b.g.global_avg_pool(d), m2])
    exe = _compile(b.g, precision, monkeypatch, True)
    _check(exe, b.g)
    assert _layouts(exe) == ["output", "input / output", "input / output / residual"]
    names = {r[1]: r[3] for r in exe.dispatch_report().rows}
    assert "NHWC input" in names["global_avg_pool"]
    pools = [r[3] for r in exe.dispatch_report().rows if r[1] == "max_pool2d"]
    assert pools == ["C max pool, NHWC input / output", "C max pool, NHWC input"]


def test_nhwc_max_pools_propagate_nan(monkeypatch):
    """A NaN in the image reaches the conv outputs around it; every pool window holding one
    gives NaN (as the reference's max), the others their max."""
    b = Builder(1, 3, 12, 11)
    a = b.conv(b.x, 20, 3, padding=1)
    m = b.g.max_pool2d(a, (3, 3), (2, 2), 1)
    b.g.set_outputs([b.conv(m, 16, 1), b.g.max_pool2d(a, (2, 2), (2, 2))])
    exe = _compile(b.g, None, monkeypatch, True)
    params = bz.init_params(b.g, 0)
    feeds = bz.random_feeds(b.g, 0)
    feeds["x"][0, 1, 5, 4] = np.nan
    for got, want in zip(exe(feeds), bz.interpret(b.g, feeds, params), strict=True):
        assert np.isnan(want).any() and not np.isnan(want).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("scale_first", [False, True])
@pytest.mark.parametrize("precision", [None, "bf16"])
def test_squeeze_excitation_scales_take_nhwc(scale_first, precision, monkeypatch):
    """RegNet-Y's block: conv -> (global average pool -> 1x1 -> relu -> 1x1 -> sigmoid) ->
    x * s per channel -> conv + residual, NHWC from end to end (batch 2: s per image)."""
    b = Builder(2, 16, 12, 10)
    x = b.conv(b.x, 48, 3, padding=1, act="relu")
    s = b.conv(b.g.global_avg_pool(x), 12, 1, act="relu")
    s = b.conv(s, 48, 1, act="sigmoid")
    y = b.g.mul(s, x) if scale_first else b.g.mul(x, s)
    b.g.set_outputs([b.conv(y, 48, 1, res=x, act="relu")])
    exe = _compile(b.g, precision, monkeypatch, True)
    _check(exe, b.g)
    (mul,) = [r[3] for r in exe.dispatch_report().rows if r[1] == "mul"]
    assert mul == "C per-channel scale, NHWC input / output"
    assert _layouts(exe)[0] == "output" and _layouts(exe)[-1] == "input / residual"


def test_grouped_convs_of_whole_panels_take_nhwc(monkeypatch):
    b = Builder(1, 32, 10, 9)
    a = b.conv(b.x, 64, 3, padding=1, act="relu")
    a = b.conv(a, 64, 3, padding=1, groups=4, act="relu")   # 16 channels per group
    b.g.set_outputs([b.conv(a, 32, 1)])
    exe = _compile(b.g, None, monkeypatch, True)
    _check(exe, b.g)
    assert _layouts(exe) == ["output", "input / output", "input"]


def _depthwise_between(multiplier: int = 1) -> bz.Graph:
    b = Builder(1, 32, 10, 9)
    a = b.conv(b.x, 32, 3, padding=1, act="relu")
    a = b.conv(a, 32 * multiplier, 3, padding=1, groups=32, act="relu")
    b.g.set_outputs([b.conv(a, 32, 1)])
    return b.g


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_convs_take_nhwc(stride, monkeypatch):
    """One filter per channel (MobileNet's): channels in vectors, taps' weights in registers."""
    b = Builder(2, 24, 13, 11)
    a = b.conv(b.x, 40, 1, act="relu6")
    a = b.conv(a, 40, 3, stride=stride, padding=1, groups=40, act="relu6")
    a = b.conv(a, 40, 1, act="relu6")
    d = b.conv(a, 40, 5, padding=2, groups=40, res=a)
    b.g.set_outputs([b.conv(d, 24, 1)])
    exe = _compile(b.g, None, monkeypatch, True)
    _check(exe, b.g)
    assert _layouts(exe) == ["output", "input / output", "input / output",
                             "input / output / residual", "input"]


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("act", ["gelu", "gelu_approx", "silu", "sigmoid", "quick_gelu",
                                 "relu", "relu6", "hard_swish", "tanh"])
def test_every_activation_is_stored_into_nhwc(act, precision, monkeypatch):
    """NHWC stores apply bias, residual and activation per 16 channels in registers
    (nhwc_io.store_nhwc; tanh the span pass), for the f32 conv and the bf16 engines alike:
    37 channels (a masked tail), padded and strided convs (tiles across rows) and a
    residual."""
    b = Builder(2, 24, 11, 9)
    a = b.conv(b.x, 37, 3, padding=1, act=act)
    m = b.conv(a, 37, 1, act=act)
    r = b.conv(m, 37, 3, padding=1, res=a, act=act)
    s = b.conv(r, 37, 3, stride=2, padding=1, act=act)
    b.g.set_outputs([b.conv(s, 16, 1)])
    exe = _compile(b.g, precision, monkeypatch, True)
    params = bz.init_params(b.g, 0)
    tol = 1e-5 if precision is None else 2e-3
    for seed in (0, 1):  # inputs scaled so every activation sees its range (tails, relu6's 6)
        feeds = {k: v * 12.0 for k, v in bz.random_feeds(b.g, seed).items()}
        (want,) = bz.interpret(exe.graph, feeds, params)
        (got,) = exe(feeds)
        assert np.abs(got - want).max() < tol * max(1.0, float(np.abs(want).max()))
    assert _layouts(exe) == ["output", "input / output", "input / output / residual",
                             "input / output", "input"]


def test_depthwise_convs_with_a_channel_multiplier_keep_nchw(monkeypatch):
    g = _depthwise_between(multiplier=2)
    exe = _compile(g, None, monkeypatch, True)
    _check(exe, g)
    assert _layouts(exe) == ["", "", ""]


def test_a_step_that_cannot_take_nhwc_rebuilds_the_program_nchw(monkeypatch):
    """The planner made to believe every conv takes NHWC: the depthwise conv with a channel
    multiplier does not say it does, so the program is built again all NCHW, and the results
    are right."""
    monkeypatch.setattr(layout, "channels_last_input", lambda node, ins, outs, ctx:
                        node.inputs[0])
    g = _depthwise_between(multiplier=2)
    exe = _compile(g, None, monkeypatch, True)
    _check(exe, g)
    assert _layouts(exe) == ["", "", ""]


def test_the_switch_keeps_every_value_nchw(monkeypatch):
    g = _chain(40)
    exe = _compile(g, None, monkeypatch, False)
    _check(exe, g)
    assert _layouts(exe) == [""] * 5
    assert not layout.enabled()


def test_f32_convs_under_the_size_limit_keep_nchw(monkeypatch):
    """Under conv_nhwc.MIN_MACS multiply-adds a dense f32 conv keeps the NCHW kernels (the
    OCR direction classifier's tiny convs ran 1.4x slower NHWC); larger ones, and depthwise
    convs of any size, take NHWC."""
    monkeypatch.setattr(conv_nhwc, "MIN_MACS", 1 << 21)
    b = Builder(1, 24, 13, 11)
    a = b.conv(b.x, 40, 3, padding=1, act="relu")      # 1.4M multiply-adds: NCHW
    a = b.conv(a, 40, 1, act="relu")
    b.g.set_outputs([b.conv(a, 24, 1)])
    exe = _compile(b.g, None, monkeypatch, True)
    _check(exe, b.g)
    assert _layouts(exe) == ["", "", ""]
    big = Builder(1, 64, 28, 28)
    a = big.conv(big.x, 64, 3, padding=1, act="relu")  # 29M: NHWC
    a = big.conv(a, 64, 3, padding=1, groups=64)       # depthwise, 0.45M: NHWC
    big.g.set_outputs([big.conv(a, 64, 3, padding=1)])
    exe = _compile(big.g, None, monkeypatch, True)
    _check(exe, big.g)
    assert _layouts(exe) == ["output", "input / output", "input"]
