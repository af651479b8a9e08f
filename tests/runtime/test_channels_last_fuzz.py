"""Property: random conv DAGs compiled with channels-last activations (runtime/layout.py) give
the reference interpreter's outputs, in fp32 and under the bf16 policy (against the policy's
own graph), on fresh random inputs, called twice (the arena is reused).

The DAGs mix what may stay NHWC (convs dense, grouped, depthwise, with residuals; max pools;
per-channel scales; global average pools) with what may not (elementwise ops, average pools,
concats, graph outputs in the middle), so values flip between layouts at random places, and
one value is often read both ways."""
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import braze as bz
from braze.runtime.kernels import conv_native, conv_nhwc

pytestmark = pytest.mark.skipif(conv_native.lib() is None or conv_nhwc.lib() is None,
                                reason="no C compiler or no AVX-512 here")
FUZZ = dict(deadline=None, suppress_health_check=list(HealthCheck),
            phases=(Phase.explicit, Phase.reuse, Phase.generate))


@st.composite
def conv_dags(draw):
    """A graph of 3-9 steps over [n, c, h, w] images; every step reads earlier values."""
    g = bz.Graph("conv_dag")
    n = draw(st.integers(1, 2))
    c = draw(st.sampled_from([8, 16, 24, 36]))
    hw = draw(st.integers(7, 14))
    vals = [g.input("x", bz.Shape((n, c, hw, hw + draw(st.integers(0, 3)))))]
    outputs = []
    count = 0
    for _ in range(draw(st.integers(3, 9))):
        src = draw(st.sampled_from(vals))
        dims = g.shape_of(src).dims
        ch, h, w = int(dims[1]), int(dims[2]), int(dims[3])
        kind = draw(st.sampled_from(["conv", "conv", "conv", "depthwise", "residual", "pool",
                                     "scale", "relu", "avg", "concat"]))
        count += 1
        if kind in ("conv", "depthwise", "residual"):
            k = draw(st.sampled_from([1, 3, 5])) if kind != "residual" else 3
            stride = draw(st.sampled_from([1, 1, 2])) if kind == "conv" and h > 6 else 1
            o = ch if kind != "conv" else draw(st.sampled_from([8, 16, 20, 32, 48]))
            groups = ch if kind == "depthwise" else \
                draw(st.sampled_from([1, 1, 2])) if ch % 16 == 0 and o % 32 == 0 else 1
            wt = g.param(f"w{count}", bz.Shape((o, ch // groups, k, k)))
            b = g.param(f"b{count}", bz.Shape((o,)))
            y = g.conv2d(src, wt, b, (stride, stride), k // 2, 1, groups)
            if kind == "residual":
                y = g.add(y, src)
            act = draw(st.sampled_from([None, "relu", "silu"]))
            y = y if act is None else g.activation(y, act)
        elif kind == "pool" and h >= 4:
            y = g.max_pool2d(src, (3, 3), (2, 2), 1)
        elif kind == "scale":
            s = g.sigmoid(g.global_avg_pool(src))
            y = g.mul(src, s)
        elif kind == "avg" and h >= 4:
            y = g.avg_pool2d(src, (2, 2), (2, 2))
        elif kind == "concat":
            same = [v for v in vals if tuple(g.shape_of(v).dims[2:]) == (h, w)]
            y = g.concat([src, draw(st.sampled_from(same))], 1)
        else:
            y = g.relu(src)
        vals.append(y)
        if draw(st.booleans()) and draw(st.booleans()):
            outputs.append(y)  # an output in the middle: stays NCHW
    outputs.append(vals[-1])
    outputs.append(g.global_avg_pool(vals[draw(st.integers(1, len(vals) - 1))]))
    g.set_outputs(list(dict.fromkeys(outputs)))
    return g


def _check(g, precision):
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, precision=precision)
    for seed in (1, 2):
        feeds = bz.random_feeds(g, seed)
        want = bz.interpret(exe.graph, feeds, params)
        got = exe(feeds)
        for a, b in zip(got, want, strict=True):
            scale = max(1.0, float(np.abs(b).max()))
            tol = 1e-4 if precision is None else 2e-3
            assert np.abs(a - b).max() <= tol * scale
    return exe


@pytest.fixture(autouse=True)
def small_convs_take_nhwc(monkeypatch):
    """The DAGs are small: let every conv take NHWC."""
    monkeypatch.setattr(conv_nhwc, "MIN_MACS", 0)


@settings(max_examples=25, **FUZZ)
@given(g=conv_dags())
def test_random_conv_dags_with_channels_last_match_the_interpreter(g):
    exe = _check(g, None)
    assert exe.dispatch_report().rows  # compiled and planned


@settings(max_examples=15, **FUZZ)
@given(g=conv_dags())
def test_random_conv_dags_under_the_bf16_policy(g):
    _check(g, "bf16")


def test_the_dags_do_keep_values_nhwc():
    """The strategy reaches the layouts it is for: a fixed draw keeps some values NHWC."""
    seen = 0

    @settings(max_examples=20, **FUZZ)
    @given(g=conv_dags())
    def count(g):
        nonlocal seen
        exe = bz.compile(g, params=bz.init_params(g, 0))
        exe(bz.random_feeds(g, 0))
        seen += any(", NHWC " in r[3] for r in exe.dispatch_report().rows)

    count()
    assert seen >= 5
