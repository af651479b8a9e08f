"""The bf16 hand-off between convs (program.py, conv.rounded_output): under the bf16 policy a
conv kept NHWC (a bf16 engine, or the NHWC f32 conv) whose result only the rounding for the
next convs reads writes that rounding itself ("bf16 out"), and the next convs copy the bf16
values in as they are ("bf16 operand handed over"). The numbers are the policy's exactly:
bit-equal to the same program without the hand-off, and the interpreter's on the policy's
graph up to the order of the sums. Where a value is also read as a residual, by another op
or returned, or the producer's store cannot round (tanh's span pass), nothing is handed
over."""
import dataclasses

import numpy as np
import pytest

import braze as bz
from braze.runtime.kernels import conv, conv_amx, conv_dp, conv_native

pytestmark = pytest.mark.skipif(conv_native.lib() is None or conv_dp.lib() is None,
                                reason="no C compiler or no AVX512-BF16 here")


@pytest.fixture(autouse=True)
def avx512_bf16_engine(monkeypatch):
    """The AVX512-BF16 engine (AMX, where there is one, set aside)."""
    monkeypatch.setattr(conv_amx, "AMX", dataclasses.replace(conv_amx.AMX, lib=lambda: None))


class Convs:
    """A graph of convs (seeded params) on an input [n, c, h, w]."""

    def __init__(self, n: int, c: int, h: int, w: int):
        self.g = bz.Graph("handoff")
        self.x = self.g.input("x", bz.Shape((n, c, h, w)))
        self.count = 0

    def conv(self, v, o, k, *, stride=1, padding=0, act=None, res=None):
        g = self.g
        self.count += 1
        c = g.shape_of(v).dims[1]
        y = g.conv2d(v, g.param(f"w{self.count}", bz.Shape((o, c, k, k))),
                     g.param(f"b{self.count}", bz.Shape((o,))), stride, padding)
        if res is not None:
            y = g.add(y, res)
        return y if act is None else g.activation(y, act)


def _compile(g, monkeypatch, handoff=True):
    monkeypatch.setenv("BRAZE_CHANNELS_LAST", "1")
    with monkeypatch.context() as m:
        if not handoff:
            m.setattr(conv, "rounded_output", lambda *args: None)
        exe = bz.compile(g, params=bz.init_params(g, 0), precision="bf16")
        exe(bz.random_feeds(g, 9))  # the program is built at the first call
    return exe


def _convs(exe) -> list[str]:
    return [r[3] for r in exe.dispatch_report().rows
            if r[1] in ("conv2d", "fused_conv_bias_act")]


def _check(exe, g, monkeypatch, scale_inputs=1.0):
    """Bit-equal to the program without the hand-off, and the interpreter on the policy's
    graph."""
    plain = _compile(g, monkeypatch, handoff=False)
    assert not any("handed over" in name or "bf16 out" in name for name in _convs(plain))
    params = bz.init_params(g, 0)
    for seed in (0, 1):
        feeds = {k: v * scale_inputs for k, v in bz.random_feeds(g, seed).items()}
        got = exe(feeds)
        for a, b in zip(got, plain(feeds), strict=True):
            np.testing.assert_array_equal(a, b)
        for a, want in zip(got, bz.interpret(exe.graph, feeds, params), strict=True):
            scale = max(1.0, float(np.abs(want).max()))
            assert np.abs(a - want).max() < 2e-3 * scale


@pytest.mark.parametrize("mid", [96, 75])  # 75: odd channels (the copy-in pads them to 76)
def test_a_bottleneck_hands_bf16_from_conv_to_conv(mid, monkeypatch):
    """1x1 -> 3x3 (padded) -> 1x1 + residual: the first two write bf16, the last two read it;
    the residual's conv keeps an f32 input (its input is the residual too)."""
    b = Convs(2, 64, 11, 9)
    a = b.conv(b.x, mid, 1, act="relu")
    a = b.conv(a, mid, 3, padding=1, act="silu")
    b.g.set_outputs([b.conv(a, 64, 1, res=b.x, act="relu")])
    exe = _compile(b.g, monkeypatch)
    first, middle, last = _convs(exe)
    assert "operand rounded in" in first and "bf16 out" in first
    assert "bf16 operand handed over" in middle and "bf16 out" in middle
    assert "bf16 operand handed over" in last and "bf16 out" not in last
    # an unpadded conv reads even channels where they are (no copy); odd ones are padded
    assert ("read in place" in last) == (mid % 2 == 0) and "read in place" not in middle
    casts = [r[3] for r in exe.dispatch_report().rows if r[1] == "cast"]
    assert sum(c.startswith("in the epilogue of") for c in casts) == 2
    _check(exe, b.g, monkeypatch)


def test_two_convs_read_one_handed_over_value_strided(monkeypatch):
    """A stage's first block: the value feeds a strided 3x3 and a strided 1x1 shortcut; both
    read the bf16 values, each padding its own copy (and the 3x3 hands its result on to the
    last 1x1, whose residual is the shortcut's f32 result)."""
    b = Convs(1, 64, 14, 13)
    a = b.conv(b.x, 80, 3, padding=1, act="gelu")
    main = b.conv(a, 72, 3, stride=2, padding=1, act="relu")
    short = b.conv(a, 72, 1, stride=2)
    b.g.set_outputs([b.conv(main, 72, 1, res=short, act="relu")])
    exe = _compile(b.g, monkeypatch)
    names = _convs(exe)
    assert "bf16 out" in names[0] and "bf16 out" not in names[-1]
    assert sum("bf16 operand handed over" in n for n in names) == 3, names
    assert sum("bf16 out" in n for n in names) == 2, names
    assert sum("read in place" in n for n in names) == 2, names  # the two 1x1s
    _check(exe, b.g, monkeypatch)


@pytest.mark.parametrize("other", ["residual", "add", "output"])
def test_a_value_read_otherwise_is_not_handed_over(other, monkeypatch):
    """Read as a residual, by an elementwise op or returned: the f32 values must exist, so the
    producer writes f32 and the next conv rounds them in."""
    b = Convs(1, 64, 9, 8)
    a = b.conv(b.x, 96, 3, padding=1, act="relu")
    y = b.conv(a, 96, 1, res=a if other == "residual" else None, act="relu")
    outs = [y, b.g.relu(a)] if other == "add" else [y, a] if other == "output" else [y]
    b.g.set_outputs(outs)
    exe = _compile(b.g, monkeypatch)
    names = _convs(exe)
    assert not any("handed over" in n or "bf16 out" in n for n in names), names
    _check(exe, b.g, monkeypatch)


def test_tanh_is_not_rounded_in_the_store_and_is_not_handed_over(monkeypatch):
    """tanh runs as a span pass after the store (not in act16): its conv writes f32."""
    b = Convs(1, 64, 9, 8)
    a = b.conv(b.x, 96, 3, padding=1, act="tanh")
    b.g.set_outputs([b.conv(a, 32, 1, act="relu")])
    exe = _compile(b.g, monkeypatch)
    first, second = _convs(exe)
    assert "bf16 out" not in first and "operand rounded in" in second
    _check(exe, b.g, monkeypatch)


@pytest.mark.parametrize("act", ["gelu", "gelu_approx", "silu", "sigmoid", "quick_gelu",
                                 "relu6", "hard_swish", None])
def test_every_store_activation_rounds_as_the_policy_does(act, monkeypatch):
    """The activation in registers, then rounded to nearest even (inputs x12: tails, relu6's
    cap): bit-equal to rounding the stored f32 values."""
    b = Convs(2, 64, 7, 9)
    a = b.conv(b.x, 70, 3, padding=1, act=act)
    b.g.set_outputs([b.conv(a, 24, 3, stride=2, padding=1)])
    exe = _compile(b.g, monkeypatch)
    first, second = _convs(exe)
    assert "bf16 out" in first and "handed over" in second
    _check(exe, b.g, monkeypatch, scale_inputs=12.0)


@pytest.mark.parametrize("stride", [1, 2])
def test_a_depthwise_f32_conv_hands_bf16_to_the_next_1x1(stride, monkeypatch):
    """MobileNet's block: expand 1x1 (bf16 engine, f32 out: the depthwise conv reads f32) ->
    depthwise 3x3 (the NHWC f32 conv: the policy leaves it f32) writing bf16 -> project 1x1
    reading it."""
    from braze.runtime.kernels import conv_nhwc

    monkeypatch.setattr(conv_nhwc, "MIN_MACS", 0)  # small graph: let every conv take NHWC
    b = Convs(1, 64, 12, 11)
    e = b.conv(b.x, 96, 1, act="relu6")
    g = b.g
    d = g.activation(g.conv2d(e, g.param("dw", bz.Shape((96, 1, 3, 3))),
                              g.param("db", bz.Shape((96,))), stride, 1, 1, 96), "relu6")
    g.set_outputs([b.conv(d, 40, 1)])
    exe = _compile(g, monkeypatch)
    expand, depthwise, project = _convs(exe)
    assert "AVX512-BF16" in expand and "bf16 out" not in expand
    assert "NHWC conv: taps" in depthwise and "bf16 out" in depthwise
    assert "bf16 operand handed over" in project
    _check(exe, g, monkeypatch)
