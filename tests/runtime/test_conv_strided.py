"""The strided conv kernels against the reference interpreter on random float32 inputs: the
depthwise conv's ring of padded rows (strides that skip rows, dilation, channel multipliers,
widths off the vector length, a residual and activation epilogue), pooling on the same row
padding, and the transposed conv whose windows do not overlap (kernel == stride: each output
pixel one read of the GEMM's columns, bias included; output padding, asymmetric padding,
groups)."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.elementwise import UnaryFn
from braze.runtime.kernels import Dispatch, conv_native
from braze.runtime.kernels.pool_resize import upscale_factor

pytestmark = pytest.mark.skipif(conv_native.lib() is None, reason="no C compiler on this machine")


def _compiled_matches(g, kind, tol=2e-5):
    """Compile `g` unfused, compare with the interpreter on two fresh feeds, return the
    implementation names of the `kind` nodes (each must run a native kernel)."""
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, fuse=False)
    for seed in (0, 1):
        feeds = bz.random_feeds(g, seed)
        want = bz.interpret(g, feeds, params)
        for a, w in zip(exe(feeds), want, strict=True):
            scale = max(1.0, float(np.abs(w).max()))
            np.testing.assert_allclose(a, w, rtol=tol, atol=tol * scale)
    rows = [r for r in exe.dispatch_report().rows if r[1] == kind]
    assert rows and {d for _, _, d, _ in rows} == {Dispatch.NATIVE}, rows
    return {impl for _, _, _, impl in rows}


DEPTHWISE_CASES = {
    # name: (n, c, h, w, multiplier, kernel, stride, padding, dilation)
    "3x3 stride 2, wide": (1, 3, 41, 77, 1, 3, 2, 1, 1),
    "5x5 stride 2, odd plane": (2, 4, 19, 21, 1, 5, 2, 2, 1),
    "1x1 stride 2 skips rows": (1, 3, 9, 11, 1, 1, 2, 0, 1),
    "2x2 stride 3 skips rows": (1, 2, 13, 14, 1, 2, 3, (1, 0, 0, 1), 1),
    "3x3 stride 2, dilation 2": (1, 3, 17, 23, 1, 3, 2, (2, 1, 2, 3), 2),
    "stride (2, 1) dilation (2, 1)": (1, 5, 14, 37, 1, 5, (2, 1), 2, (2, 1)),
    "stride (1, 3), multiplier 3": (1, 2, 9, 40, 3, 3, (1, 3), 1, 1),
    "stride 2, rows past the image": (1, 2, 6, 6, 1, 3, 2, (3, 3, 4, 4), 1),
    "stride 2, plane narrower than a vector": (1, 6, 7, 5, 2, 3, 2, 1, 1),
}


@pytest.mark.parametrize("act", [None, UnaryFn.HARD_SWISH, UnaryFn.EXP],
                         ids=lambda a: str(a and a.value))
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("case", sorted(DEPTHWISE_CASES))
def test_depthwise(case, residual, act):
    n, c, h, w, mult, k, stride, padding, dilation = DEPTHWISE_CASES[case]
    g = bz.Graph("depthwise")
    x = g.input("x", bz.Shape((n, c, h, w)))
    wt = g.param("w", bz.Shape((c * mult, 1, k, k)))
    b = g.param("b", bz.Shape((c * mult,)))
    if residual or act is not None:
        probe = bz.Graph("probe")
        px = probe.input("x", bz.Shape((n, c, h, w)))
        pw = probe.param("w", bz.Shape((c * mult, 1, k, k)))
        out = probe.shape_of(probe.conv2d(px, pw, None, stride, padding, dilation, c))
        r = g.tanh(g.input("r", bz.Shape(out.dims))) if residual else None
        y = g.fused_conv_bias_act(x, wt, b, stride, padding, dilation, c, act=act, residual=r)
        kind = "fused_conv_bias_act"
    else:
        y, kind = g.conv2d(x, wt, b, stride, padding, dilation, c), "conv2d"
    g.set_outputs([y])
    (name,) = _compiled_matches(g, kind, tol=5e-5)
    assert "depthwise" in name


@pytest.mark.parametrize("kind, kernel, stride, padding, shape", [
    ("max", 3, 2, (1, 1, 1, 1), (1, 3, 33, 47)),
    ("avg", 3, 3, (1, 2, 1, 0), (2, 2, 17, 19)),
    ("max", 2, 4, 0, (1, 2, 15, 18)),
])
def test_pool2d_strided(kind, kernel, stride, padding, shape):
    g = bz.Graph("pool")
    x = g.input("x", bz.Shape(shape))
    g.set_outputs([g.pool(x, kind, kernel, stride, padding)])
    _compiled_matches(g, f"{kind}_pool2d")


@pytest.mark.parametrize("at", [(0, 0), (4, 5), (7, 9)])  # first, middle, last of a window
def test_max_pool_propagates_nan(at):
    """A NaN anywhere in a window makes its max NaN, as the reference (np.max) and PyTorch
    give (the kernels build with -ffast-math, so the test reads the bits)."""
    g = bz.Graph("pool")
    x = g.input("x", bz.Shape((1, 2, 9, 10)))
    g.set_outputs([g.pool(x, "max", 3, 2, 1), g.pool(x, "max", 2, 2, 0)])
    exe = bz.compile(g, fuse=False)
    feeds = bz.random_feeds(g, 0)
    feeds["x"][0, 1, at[0], at[1]] = np.nan
    for got, want in zip(exe(feeds), bz.interpret(g, feeds), strict=True):
        assert np.isnan(want).any()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, equal_nan=True)


TRANSPOSE_CASES = {
    # name: (n, c, h, w, out channels per group, kernel, attributes)
    "2x2 stride 2": (1, 6, 5, 7, 4, 2, dict(stride=2)),
    "2x2 stride 2, one output channel, batch 2": (2, 5, 9, 8, 1, 2, dict(stride=2)),
    "2x2 stride 2, output padding": (1, 3, 4, 6, 2, 2, dict(stride=2, output_padding=1)),
    "2x2 stride 2, padding": (1, 4, 6, 5, 3, 2, dict(stride=2, padding=(1, 1, 0, 1))),
    "3x3 stride 3, groups 2": (1, 6, 4, 5, 2, 3, dict(stride=3, groups=2)),
    "(2, 3) stride (2, 3), padding, output padding": (
        1, 3, 5, 4, 2, (2, 3), dict(stride=(2, 3), padding=(0, 2, 1, 0),
                                    output_padding=(1, 2))),
    "no bias": (1, 4, 5, 5, 3, 2, dict(stride=2, bias=False)),
}


@pytest.mark.parametrize("case", sorted(TRANSPOSE_CASES))
@pytest.mark.parametrize("fed", [False, True], ids=["static weight", "weight fed"])
def test_conv_transpose_without_overlap(case, fed):
    n, c, h, w, og, k, attrs = TRANSPOSE_CASES[case]
    attrs = dict(attrs)
    bias, groups = attrs.pop("bias", True), attrs.get("groups", 1)
    kh, kw = (k, k) if isinstance(k, int) else k
    g = bz.Graph("deconv")
    x = g.input("x", bz.Shape((n, c, h, w)))
    shape = bz.Shape((c, og, kh, kw))
    wt = g.input("w", shape) if fed else g.param("w", shape)
    b = g.param("b", bz.Shape((og * groups,))) if bias else None
    g.set_outputs([g.conv_transpose2d(x, wt, b, **attrs)])
    assert _compiled_matches(g, "conv_transpose2d") == {
        "BLAS GEMM + C disjoint col2im with bias"}


@pytest.mark.parametrize("size, scale, coordinate", [
    ((14, 10), (2.0, 2.0), "asymmetric"),
    ((28, 20), (4.0, 4.0), "asymmetric"),
    ((21, 15), (3.0, 3.0), "asymmetric"),
    ((14, 10), None, "half_pixel"),
    ((11, 13), None, "asymmetric"),
])
def test_nearest_resize_copies_rows_and_repeats_columns(size, scale, coordinate):
    """Integer upscales write each source value `repeat` times and copy repeated rows; other
    tables gather; all bit-exact."""
    g = bz.Graph("resize")
    x = g.input("x", bz.Shape((2, 3, 7, 5)))
    g.set_outputs([g.resize(x, size, "nearest", coordinate, "floor", scale)])
    assert _compiled_matches(g, "resize", tol=0) == {"C nearest gather"}


def test_upscale_factor():
    assert upscale_factor(np.arange(10) // 2, 5) == 2
    assert upscale_factor(np.arange(12) // 4, 3) == 4
    assert upscale_factor(np.arange(10) // 2, 4) == 0  # the table's length is not f * n_in
    assert upscale_factor(np.array([0, 0, 1, 2, 2, 2]), 3) == 0
    assert upscale_factor(np.arange(5), 7) == 0  # a downscale
