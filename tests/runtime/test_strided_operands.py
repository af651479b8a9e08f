"""Views that are not C-contiguous (a channel narrow, a broadcast expand) read by the one-call C
kernels (convs, pools, resize: conv_native.c_kernel). Those kernels copy such inputs to
contiguous arrays on every call; the copies must live until the C call returns (they were
freed once their addresses were taken: garbage outputs, found by the held-out sweep on
FocalNet and on torch `chunk` -> conv). Compiled (fused and unfused, fp32 and the bf16 policy)
against the interpreter over several calls, with allocations in between that would reuse freed
memory."""
import numpy as np
import pytest

import braze as bz
from braze.runtime.kernels import conv_native

pytestmark = pytest.mark.skipif(conv_native.lib() is None, reason="no C compiler here")


def _consumer(g, v, kind):
    c = g.shape_of(v).dims[1]
    if kind == "conv":
        return g.conv2d(v, g.param("w", bz.Shape((12, c, 3, 3))), g.param("b", bz.Shape((12,))),
                        1, 1)
    if kind == "conv_relu":
        return g.relu(g.conv2d(v, g.param("w", bz.Shape((12, c, 3, 3))), None, 2, 1))
    if kind == "depthwise":
        return g.conv2d(v, g.param("w", bz.Shape((c, 1, 3, 3))), None, 1, 1, 1, c)
    if kind == "grouped":
        return g.conv2d(v, g.param("w", bz.Shape((8, c // 2, 1, 1))), None, 1, 0, 1, 2)
    if kind == "conv_transpose":
        return g.conv_transpose2d(v, g.param("w", bz.Shape((c, 6, 2, 2))), None, 2)
    if kind == "max_pool":
        return g.max_pool2d(v, 2, 2)
    if kind == "avg_pool":
        return g.avg_pool2d(v, 3, 1, 1)
    if kind == "global_avg_pool":
        return g.global_avg_pool(v)
    return g.resize(v, (18, 14), "linear")


KINDS = ["conv", "conv_relu", "depthwise", "grouped", "conv_transpose", "max_pool", "avg_pool",
         "global_avg_pool", "resize"]


def _graph(view: str, kind: str) -> bz.Graph:
    g = bz.Graph("strided")
    if view == "narrow":  # channels 8..24 of 32: every image's run is strided
        x = g.input("x", bz.Shape((2, 32, 9, 7)))
        v = g.narrow(x, 1, 8, 16)
    else:  # one image broadcast over the batch
        x = g.input("x", bz.Shape((1, 16, 9, 7)))
        v = g.expand(x, (3, 16, 9, 7))
    g.set_outputs([_consumer(g, v, kind)])
    return g


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("view", ["narrow", "expand"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_strided_view_read_by_a_c_kernel(kind, view, fuse, precision):
    g = _graph(view, kind)
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, fuse=fuse, precision=precision)
    tol = 1e-5 if precision is None else 2e-3
    for seed in range(4):
        feeds = bz.random_feeds(g, seed)
        (want,) = bz.interpret(exe.graph, feeds, params)
        (got,) = exe(feeds)
        junk = [np.full(n, 1e30, np.float32) for n in (1 << 10, 1 << 12, 1 << 14)]  # noqa: F841
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(got - want).max() < tol * scale, (seed, np.abs(got - want).max())
