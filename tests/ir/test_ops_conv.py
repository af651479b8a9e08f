"""Conv family specification: conv2d, conv_transpose2d, pooling, global average pooling and
nearest 2x resize, checked against explicit-loop NumPy written here on tiny shapes."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.conv import Conv2d, ConvTranspose2d, GlobalAvgPool, Pool2d, PoolKind

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# -- independent loop implementations ----------------------------------------------------------
def loop_conv2d(x, w, b, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    t, left, bot, r = pad
    ho = (h + t + bot - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + left + r - dil[1] * (kw - 1) - 1) // stride[1] + 1
    og = o // groups
    out = np.zeros((n, o, ho, wo))
    for ni in range(n):
        for oc in range(o):
            g = oc // og
            for y in range(ho):
                for xx in range(wo):
                    acc = 0.0 if b is None else float(b[oc])
                    for ci in range(cg):
                        for i in range(kh):
                            for j in range(kw):
                                hy = y * stride[0] + i * dil[0] - t
                                wx = xx * stride[1] + j * dil[1] - left
                                if 0 <= hy < h and 0 <= wx < wd:
                                    acc += x[ni, g * cg + ci, hy, wx] * w[oc, ci, i, j]
                    out[ni, oc, y, xx] = acc
    return out


def loop_conv_transpose2d(x, w, b, stride, pad, out_pad, dil, groups):
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    cg = c // groups
    t, left, bot, r = pad
    ho = (h - 1) * stride[0] - t - bot + dil[0] * (kh - 1) + out_pad[0] + 1
    wo = (wd - 1) * stride[1] - left - r + dil[1] * (kw - 1) + out_pad[1] + 1
    out = np.zeros((n, og * groups, ho, wo))
    for ni in range(n):
        for ci in range(c):
            g = ci // cg
            for y in range(h):
                for xx in range(wd):
                    for oc in range(og):
                        for i in range(kh):
                            for j in range(kw):
                                oy = y * stride[0] + i * dil[0] - t
                                ox = xx * stride[1] + j * dil[1] - left
                                if 0 <= oy < ho and 0 <= ox < wo:
                                    contrib = x[ni, ci, y, xx] * w[ci, oc, i, j]
                                    out[ni, g * og + oc, oy, ox] += contrib
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out


def loop_pool(x, kind, kernel, stride, pad, include_pad):
    n, c, h, wd = x.shape
    t, left, bot, r = pad
    ho = (h + t + bot - kernel[0]) // stride[0] + 1
    wo = (wd + left + r - kernel[1]) // stride[1] + 1
    out = np.zeros((n, c, ho, wo))
    for ni in range(n):
        for ci in range(c):
            for y in range(ho):
                for xx in range(wo):
                    vals = []
                    for i in range(kernel[0]):
                        for j in range(kernel[1]):
                            hy, wx = y * stride[0] + i - t, xx * stride[1] + j - left
                            if 0 <= hy < h and 0 <= wx < wd:
                                vals.append(x[ni, ci, hy, wx])
                    if kind == "max":
                        out[ni, ci, y, xx] = max(vals)
                    else:
                        denom = kernel[0] * kernel[1] if include_pad else len(vals)
                        out[ni, ci, y, xx] = sum(vals) / denom
    return out


def run1(g, out, feeds, **kw):
    g.set_outputs([out])
    return bz.interpret(g, feeds, **kw)[0]


# -- conv2d -------------------------------------------------------------------------------------
def test_conv2d_infers_strided_padded_dilated_grouped_shapes():
    g = bz.Graph()
    x = g.input("x", bz.Shape(("batch", 4, 9, 8)))
    w = g.param("w", bz.Shape((6, 2, 3, 2)))
    b = g.param("b", bz.Shape((6,)))
    y = g.conv2d(x, w, b, stride=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2), groups=2)
    # H: (9 + 1 + 2 - 3) // 2 + 1 = 5 ; W: (8 + 0 + 1 - 3) // 1 + 1 = 7
    assert g.shape_of(y) == bz.Shape(("batch", 6, 5, 7))
    op = g.node(y).op
    assert op == Conv2d((2, 1), (1, 0, 2, 1), (1, 2), 2, True)


def test_conv2d_symbolic_spatial_when_size_is_kept_or_a_multiple_of_the_stride():
    g = bz.Graph()
    x = g.input("x", bz.Shape(("n", 3, "h", "w")))
    w = g.param("w", bz.Shape((5, 3, 3, 3)))
    assert g.shape_of(g.conv2d(x, w, padding=1)) == bz.Shape(("n", 5, "h", "w"))
    with pytest.raises(bz.ShapeError, match="conv2d with stride 2 needs H static or declared a "
                                            "multiple of the stride"):
        g.conv2d(x, w, stride=2, padding=1)
    g = bz.Graph()
    x32 = g.input("x32", bz.Shape(("n", 3, "32*h", "8*w+3")))
    w = g.param("w", bz.Shape((5, 3, 3, 3)))
    # H: (32h + 2 - 3) // 2 + 1 = 16h ; W: (8w + 3 + 0 - 3) // 2 + 1 = 4w + 1
    y = g.conv2d(x32, w, stride=2, padding=(1, 0, 1, 0))
    assert g.shape_of(y) == bz.Shape(("n", 5, "16*h", "4*w+1"))
    pooled = g.max_pool2d(y, 2, 2)  # H: 8h ; W: (4w + 1 - 2) // 2 + 1 = 2w
    assert g.shape_of(pooled) == bz.Shape(("n", 5, "8*h", "2*w"))
    g.set_outputs([pooled])
    for hv, wv in ((1, 2), (3, 1)):
        xv = rand(2, 3, 32 * hv, 8 * wv + 3)
        got = bz.interpret(g, {"x32": xv}, {"w": rand(5, 3, 3, 3)})[0]
        assert got.shape == (2, 5, 8 * hv, 2 * wv)


def test_conv_transpose2d_of_symbolic_spatial_dims():
    g = bz.Graph()
    x = g.input("x", bz.Shape((1, 4, "h", "2*w")))
    w = g.param("w", bz.Shape((4, 2, 2, 2)))
    y = g.conv_transpose2d(x, w, stride=(2, 2))
    assert g.shape_of(y) == bz.Shape((1, 2, "2*h", "4*w"))


@pytest.mark.parametrize("w_shape, kw, msg", [
    ((6, 3, 3, 3), {}, "4 channels"),
    ((6, 2, 3, 3), {"groups": 4}, "not divisible by groups"),
    ((6, 4, 7, 7), {}, "larger than the padded"),
    ((6, 4, 3, 3), {"stride": 0}, "stride must be ints >= 1"),
])
def test_conv2d_rejects_mismatches_naming_the_op(w_shape, kw, msg):
    g = bz.Graph()
    x = g.input("x", bz.Shape((1, 4, 5, 5)))
    w = g.param("w", bz.Shape(w_shape))
    with pytest.raises(bz.ShapeError, match=f"conv2d.*{msg}"):
        g.conv2d(x, w, **kw)


def test_an_unpadded_window_over_a_symbolic_axis_says_what_to_do():
    """h - 2 may be 0 for the smallest h (symbols are >= 2): refused, saying to make the axis
    static or pad; padded 'same' it keeps the symbol."""
    g = bz.Graph()
    x = g.input("x", bz.Shape((1, 4, "h", 9)))
    w = g.param("w", bz.Shape((6, 4, 3, 3)))
    with pytest.raises(bz.ShapeError, match=r"smallest h .*make H static, or pad the window"):
        g.conv2d(x, w)
    assert g.shape_of(g.conv2d(x, w, padding=1)) == bz.Shape((1, 6, "h", 9))


def test_conv2d_bias_must_match_out_channels():
    g = bz.Graph()
    x = g.input("x", bz.Shape((1, 4, 5, 5)))
    w = g.param("w", bz.Shape((6, 4, 3, 3)))
    with pytest.raises(bz.ShapeError, match=r"conv2d.*bias must be \[6\]"):
        g.conv2d(x, w, g.param("b", bz.Shape((4,))))


@pytest.mark.parametrize("stride, pad, dil, groups, bias", [
    ((1, 1), (0, 0, 0, 0), (1, 1), 1, False),
    ((2, 1), (1, 0, 2, 1), (1, 1), 1, True),
    ((1, 2), (1, 1, 1, 1), (2, 1), 2, True),
    ((1, 1), (1, 1, 1, 1), (1, 1), 4, False),  # depthwise
])
def test_conv2d_reference_matches_loops(stride, pad, dil, groups, bias):
    x = rand(2, 4, 7, 6)
    w = rand(8, 4 // groups, 3, 2)
    b = rand(8) if bias else None
    op = Conv2d(stride, pad, dil, groups, bias)
    got = op.reference(x, w, *([b] if bias else []))
    want = loop_conv2d(x.astype(np.float64), w, b, stride, pad, dil, groups)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv2d_f16_input_keeps_dtype():
    x, w = rand(1, 2, 4, 4, dtype=np.float16), rand(3, 2, 2, 2, dtype=np.float16)
    got = Conv2d((1, 1), (0, 0, 0, 0), (1, 1), 1, False).reference(x, w)
    assert got.dtype == np.float16
    want = loop_conv2d(x.astype(np.float64), w.astype(np.float64), None, (1, 1), (0,) * 4,
                       (1, 1), 1)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_resnet_sized_conv_runs_through_interpreter():
    g = bz.Graph()
    x = g.input("x", bz.Shape((1, 64, 56, 56)))
    w = g.param("w", bz.Shape((64, 64, 3, 3)))
    y = g.conv2d(x, w, padding=1)
    xv, wv = rand(1, 64, 56, 56), rand(64, 64, 3, 3)
    got = run1(g, y, {"x": xv}, params={"w": wv})
    assert got.shape == (1, 64, 56, 56)
    # spot-check one interior and one border output element by direct summation
    patch = xv[0, :, 9:12, 19:22]
    assert np.isclose(got[0, 5, 10, 20], np.sum(patch * wv[5]), rtol=1e-4, atol=1e-3)
    corner = xv[0, :, 0:2, 0:2]
    assert np.isclose(got[0, 7, 0, 0], np.sum(corner * wv[7, :, 1:, 1:]), rtol=1e-4, atol=1e-3)


# -- conv_transpose2d ---------------------------------------------------------------------------
def test_conv_transpose2d_infers_output_size():
    g = bz.Graph()
    x = g.input("x", bz.Shape(("n", 4, 5, 6)))
    w = g.param("w", bz.Shape((4, 3, 3, 3)))
    y = g.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1, groups=2)
    # (5 - 1) * 2 - 2 + 2 + 1 + 1 = 10 ; (6 - 1) * 2 - 2 + 2 + 1 + 1 = 12 ; out ch = 3 * 2
    assert g.shape_of(y) == bz.Shape(("n", 6, 10, 12))
    with pytest.raises(bz.ShapeError, match="conv_transpose2d.*output_padding"):
        g.conv_transpose2d(x, w, stride=1, output_padding=1)


@pytest.mark.parametrize("stride, pad, out_pad, dil, groups, bias", [
    ((1, 1), (0, 0, 0, 0), (0, 0), (1, 1), 1, False),
    ((2, 2), (1, 1, 1, 1), (1, 0), (1, 1), 1, True),
    ((2, 3), (0, 1, 2, 0), (0, 2), (2, 1), 2, True),
])
def test_conv_transpose2d_reference_matches_loops(stride, pad, out_pad, dil, groups, bias):
    x = rand(2, 4, 4, 3)
    w = rand(4, 3, 3, 2)
    b = rand(3 * groups) if bias else None
    op = ConvTranspose2d(stride, pad, out_pad, dil, groups, bias)
    got = op.reference(x, w, *([b] if bias else []))
    want = loop_conv_transpose2d(x.astype(np.float64), w, b, stride, pad, out_pad, dil, groups)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_transpose2d_is_the_adjoint_of_conv2d():
    """<conv(x, w), y> == <x, conv_transpose(y, w)> for the same stride/padding/dilation."""
    x = rand(1, 4, 9, 8).astype(np.float64)
    w = rand(6, 2, 3, 3).astype(np.float64)
    attrs = dict(stride=(2, 2), padding=(1, 0, 1, 2), dilation=(1, 2), groups=2)
    y_fwd = Conv2d(has_bias=False, **attrs).reference(x, w)
    y = rand(*y_fwd.shape).astype(np.float64)
    back = ConvTranspose2d(output_padding=(0, 0), has_bias=False, **attrs).reference(y, w)
    # x's trailing row/col that no window reads are not reproduced; compare on the overlap
    h, wd = back.shape[2:]
    assert np.isclose(np.sum(y_fwd * y), np.sum(x[:, :, :h, :wd] * back))


# -- pooling, global pool, resize --------------------------------------------------------------
def test_pool_infers_and_defaults_stride_to_kernel():
    g = bz.Graph()
    x = g.input("x", bz.Shape(("n", 3, 8, 7)))
    assert g.shape_of(g.max_pool2d(x, 2)) == bz.Shape(("n", 3, 4, 3))
    assert g.shape_of(g.avg_pool2d(x, 3, stride=1, padding=1)) == bz.Shape(("n", 3, 8, 7))
    assert g.node(g.pool(x, "avg", (2, 3))).op == Pool2d(PoolKind.AVG, (2, 3), (2, 3),
                                                          (0, 0, 0, 0))
    with pytest.raises(bz.ShapeError, match="max_pool2d.*smaller than kernel"):
        g.max_pool2d(x, 2, padding=2)
    with pytest.raises(bz.GraphError, match="unknown pool kind"):
        g.pool(x, "min", 2)


@pytest.mark.parametrize("kind, kernel, stride, pad, include_pad", [
    ("max", (2, 2), (2, 2), (0, 0, 0, 0), False),
    ("max", (3, 2), (2, 1), (1, 0, 1, 1), False),
    ("avg", (3, 3), (1, 2), (1, 1, 1, 1), False),
    ("avg", (3, 3), (1, 2), (1, 1, 1, 1), True),
    ("avg", (2, 3), (2, 2), (0, 2, 1, 0), False),
])
def test_pool_reference_matches_loops(kind, kernel, stride, pad, include_pad):
    x = rand(2, 3, 7, 6)
    op = Pool2d(PoolKind(kind), kernel, stride, pad, include_pad)
    want = loop_pool(x.astype(np.float64), kind, kernel, stride, pad, include_pad)
    np.testing.assert_allclose(op.reference(x), want, rtol=1e-5, atol=1e-6)


def test_max_pool_of_ints_pads_with_the_lowest_int():
    x = -np.arange(16, dtype=np.int32).reshape(1, 1, 4, 4) - 100
    got = Pool2d(PoolKind.MAX, (2, 2), (2, 2), (1, 1, 0, 0)).reference(x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, loop_pool(x, "max", (2, 2), (2, 2), (1, 1, 0, 0), False))


def test_global_avg_pool_and_resize():
    g = bz.Graph()
    x = g.input("x", bz.Shape(("n", 3, 4, 5)))
    gp, up = g.global_avg_pool(x), g.resize_nearest_2x(x)
    assert g.shape_of(gp) == bz.Shape(("n", 3, 1, 1))
    assert g.shape_of(up) == bz.Shape(("n", 3, 8, 10))
    xv = rand(2, 3, 4, 5)
    g.set_outputs([gp, up])
    got_gp, got_up = bz.interpret(g, {"x": xv})
    np.testing.assert_allclose(got_gp[..., 0, 0], xv.sum(axis=(2, 3)) / 20, rtol=1e-5)
    for i in range(8):
        for j in range(10):
            np.testing.assert_array_equal(got_up[:, :, i, j], xv[:, :, i // 2, j // 2])
    assert g.shape_of(g.resize_nearest_2x(g.input("y", bz.Shape((1, 3, "h", 4))))) == \
        bz.Shape((1, 3, "2*h", 8))
    with pytest.raises(bz.ShapeError, match=r"global_avg_pool.*\[N, C, H, W\]"):
        g.global_avg_pool(g.input("z", bz.Shape((3, 4, 5))))


def test_small_cnn_float64_interpret_matches_loops():
    g = bz.Graph("cnn")
    x = g.input("x", bz.Shape(("n", 2, 6, 6)))
    w1, b1 = g.param("w1", bz.Shape((4, 2, 3, 3))), g.param("b1", bz.Shape((4,)))
    w2 = g.param("w2", bz.Shape((4, 3, 2, 2)))
    h = g.relu(g.conv2d(x, w1, b1, padding=1))
    h = g.max_pool2d(h, 2)
    h = g.conv_transpose2d(h, w2, stride=2)
    y = g.global_avg_pool(h)
    params = bz.init_params(g, seed=1)
    xv = rand(2, 2, 6, 6)
    got = run1(g, y, {"x": xv}, params=params, float64=True)
    assert got.dtype == np.float64 and got.shape == (2, 3, 1, 1)
    p = {k: v.astype(np.float64) for k, v in params.items()}
    ref = loop_conv2d(xv.astype(np.float64), p["w1"], p["b1"], (1, 1), (1,) * 4, (1, 1), 1)
    ref = loop_pool(np.maximum(ref, 0), "max", (2, 2), (2, 2), (0,) * 4, False)
    ref = loop_conv_transpose2d(ref, p["w2"], None, (2, 2), (0,) * 4, (0, 0), (1, 1), 1)
    np.testing.assert_allclose(got, ref.mean(axis=(2, 3), keepdims=True), rtol=1e-12)


def test_global_avg_pool_op_is_plain():
    assert not GlobalAvgPool.composite and not Conv2d.composite and not Pool2d.composite


def test_scaled_floor_keeps_a_polynomial_only_where_it_is_exact():
    from braze.ir.symbolic import SymDim

    d = SymDim.of("32*h+2")
    assert d.scaled_floor(0.5) == SymDim.of("16*h+1")
    assert d.scaled_floor(1.5) == SymDim.of("48*h+3")
    assert d.scaled_floor(0.25) == SymDim.of("8*h")  # floor((32h + 2) / 4)
    assert d.scaled_floor(2) == SymDim.of("64*h+4")
    assert d.scaled_floor(1 / 64) is None  # 32 is not a multiple of 64
    assert d.scaled_floor(1 / 3) is None   # not exact in floating point
    assert SymDim.of("h-3").scaled_floor(0.5) is None  # may be negative
    for h in range(1, 9):
        assert d.scaled_floor(0.25).evaluate({"h": h}) == (32 * h + 2) // 4
