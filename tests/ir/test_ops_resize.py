"""Resize specification (braze/ir/ops/resize.py): the reference matches a per-pixel loop written
here from the ONNX formulas, shape inference and attribute errors, symbolic input sizes, text
round trip; and Pad's reflect / edge modes."""
import math

import numpy as np
import pytest

import braze as bz
from braze.ir.dtypes import dtype_from_numpy
from braze.ir.ops.resize import CoordinateMode, NearestMode, Resize, ResizeMode
from braze.ir.ops.shape import Pad, PadMode

RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# -- an independent per-pixel implementation ----------------------------------------------------
def coord(mode: str, i: int, n_in: int, n_out: int, scale: float) -> float:
    if mode == "asymmetric":
        return i / scale
    if mode == "tf_half_pixel_for_nn":
        return (i + 0.5) / scale
    if mode == "align_corners":
        return 0.0 if n_out == 1 else i * (n_in - 1) / (n_out - 1)
    if mode == "pytorch_half_pixel" and n_out == 1:
        return 0.0
    x = (i + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        x += n_in / 2 * (1 - n_out / (scale * n_in))
    return x


def round_nearest(c: float, mode: str) -> int:
    if mode == "floor":
        return math.floor(c)
    if mode == "ceil":
        return math.ceil(c)
    frac = c - math.floor(c)
    if frac == 0.5:
        return math.floor(c) if mode == "round_prefer_floor" else math.ceil(c)
    return math.floor(c + 0.5)


def taps(c: float, n_in: int, mode: str, a: float, exclude: bool) -> list[tuple[int, float]]:
    """(source index, weight) pairs of one output coordinate."""
    if mode == "linear":
        c = min(max(c, 0.0), n_in - 1)
        lo = min(math.floor(c), n_in - 1)
        hi = min(lo + 1, n_in - 1)
        return [(lo, 1 - (c - lo)), (hi, c - lo)]

    def kernel(t):
        t = abs(t)
        if t <= 1:
            return (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1
        if t < 2:
            return a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a
        return 0.0

    base = math.floor(c)
    out = [(base + k, kernel(c - (base + k))) for k in (-1, 0, 1, 2)]
    if exclude:
        out = [(j, w) for j, w in out if 0 <= j < n_in]
        total = sum(w for _, w in out)
        out = [(j, w / total) for j, w in out]
    return [(min(max(j, 0), n_in - 1), w) for j, w in out]


def loop_resize(x, size, mode, cmode, nmode, scale=None, a=-0.75, exclude=False):
    n, c, h, w = x.shape
    sh = scale[0] if scale else size[0] / h
    sw = scale[1] if scale else size[1] / w
    out = np.zeros((n, c) + tuple(size))
    for i in range(size[0]):
        ci = coord(cmode, i, h, size[0], sh)
        for j in range(size[1]):
            cj = coord(cmode, j, w, size[1], sw)
            if mode == "nearest":
                ii = min(max(round_nearest(ci, nmode), 0), h - 1)
                jj = min(max(round_nearest(cj, nmode), 0), w - 1)
                out[:, :, i, j] = x[:, :, ii, jj]
                continue
            for ii, wi in taps(ci, h, mode, a, exclude):
                for jj, wj in taps(cj, w, mode, a, exclude):
                    out[:, :, i, j] += wi * wj * x[:, :, ii, jj]
    return out


def run(x, **kw):
    g = bz.Graph("t")
    v = g.input("x", bz.Shape(x.shape, dtype_from_numpy(x.dtype)))
    g.set_outputs([g.resize(v, **kw)])
    return g, bz.interpret(g, {"x": x})[0]


# -- reference against the loop -----------------------------------------------------------------
COORDS = [m.value for m in CoordinateMode]


@pytest.mark.parametrize("cmode", COORDS)
@pytest.mark.parametrize("nmode", [m.value for m in NearestMode])
@pytest.mark.parametrize("size,scale", [((8, 6), None), ((3, 2), None), ((7, 11), (1.5, 2.75)),
                                        ((1, 1), None)])
def test_nearest_matches_the_loop(cmode, nmode, size, scale):
    x = rand(2, 3, 4, 5)
    _, got = run(x, size=size, mode="nearest", coordinate=cmode, nearest=nmode, scale=scale)
    np.testing.assert_array_equal(got, loop_resize(x, size, "nearest", cmode, nmode, scale))


@pytest.mark.parametrize("cmode", COORDS)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("size,scale", [((8, 13), None), ((3, 2), None), ((6, 9), (1.5, 1.8)),
                                        ((1, 4), None)])
def test_linear_and_cubic_match_the_loop(cmode, mode, size, scale):
    x = rand(1, 2, 4, 6)
    _, got = run(x, size=size, mode=mode, coordinate=cmode, scale=scale)
    want = loop_resize(x, size, mode, cmode, "floor", scale)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("a,exclude", [(-0.5, False), (-0.75, True), (-0.6, True)])
def test_cubic_coefficient_and_exclude_outside(a, exclude):
    x = rand(1, 1, 5, 5)
    _, got = run(x, size=(9, 3), mode="cubic", coordinate="asymmetric", cubic_a=a,
                 exclude_outside=exclude)
    want = loop_resize(x, (9, 3), "cubic", "asymmetric", "floor", None, a, exclude)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_nearest_2x_indices_equal_resize_nearest_2x():
    x = rand(1, 2, 3, 4)
    g = bz.Graph("t")
    v = g.input("x", bz.Shape(x.shape))
    g.set_outputs([g.resize(v, (6, 8), coordinate="asymmetric", nearest="floor"),
                   g.resize_nearest_2x(v)])
    a, b = bz.interpret(g, {"x": x})
    np.testing.assert_array_equal(a, b)


def test_nearest_keeps_integer_dtypes_and_linear_is_exact_at_identity():
    x = RNG.integers(0, 100, (1, 2, 3, 3)).astype(np.int32)
    _, got = run(x, size=(5, 4), mode="nearest")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, loop_resize(x, (5, 4), "nearest", "half_pixel",
                                                   "round_prefer_floor"))
    y = rand(1, 2, 3, 3)
    _, same = run(y, size=(3, 3), mode="linear")
    np.testing.assert_allclose(same, y, rtol=0, atol=1e-7)


def test_float64_interpolates_in_float64_from_float32_coordinates():
    """Source coordinates are float32 by definition (as ONNX Runtime computes them), so a
    float64 resize differs from exact-coordinate arithmetic only at float32 resolution."""
    x = rand(1, 1, 4, 4).astype(np.float64)
    _, got = run(x, size=(7, 5), mode="cubic")
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, loop_resize(x, (7, 5), "cubic", "half_pixel", "floor"),
                               rtol=1e-6, atol=1e-6)
    _, exact = run(x, size=(8, 8), mode="linear", coordinate="asymmetric")
    np.testing.assert_allclose(exact, loop_resize(x, (8, 8), "linear", "asymmetric", "floor"),
                               rtol=1e-14, atol=1e-14)


# -- inference, symbols, errors, text -----------------------------------------------------------
def test_a_static_output_size_of_symbolic_input_spatial_dims():
    g = bz.Graph("t")
    v = g.input("x", bz.Shape(("n", 3, "h", "w")))
    y = g.resize(v, (10, 12), mode="linear")
    g.set_outputs([y])
    assert g.shape_of(y).dims == ("n", 3, 10, 12)
    x = rand(2, 3, 5, 4)
    np.testing.assert_allclose(bz.interpret(g, {"x": x})[0],
                               loop_resize(x, (10, 12), "linear", "half_pixel", "floor"),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_symbolic_output_size_follows_each_binding(mode):
    """size ("2*h", "2*w+1"): the tables are built per binding from the actual lengths, equal
    to a static resize at those lengths; binding the symbols makes the size static."""
    g = bz.Graph("t")
    v = g.input("x", bz.Shape(("n", 3, "h", "w")))
    y = g.resize(v, ("2*h", "2*w+1"), mode=mode, coordinate="align_corners")
    g.set_outputs([y])
    assert g.shape_of(y).dims == ("n", 3, "2*h", "2*w+1")
    for h, w in ((3, 4), (5, 2)):
        x = rand(2, 3, h, w)
        want = loop_resize(x, (2 * h, 2 * w + 1), mode, "align_corners", "round_prefer_floor")
        for graph in (g, g.bind(h=h, w=w)):
            np.testing.assert_allclose(bz.interpret(graph, {"x": x})[0], want, rtol=1e-5,
                                       atol=1e-5)
            np.testing.assert_allclose(bz.compile(graph)({"x": x})[0], want, rtol=1e-5,
                                       atol=1e-5)
    assert g.bind(h=3, w=4).shape_of(g.bind(h=3, w=4).outputs[0]).dims == ("n", 3, 6, 9)


@pytest.mark.parametrize("shape,kw,needle", [
    ((1, 3, 4), dict(size=(2, 2)), "must be [N, C, H, W]"),
    ((1, 3, 4, 4), dict(size=(0, 2)), "size must be two dims >= 1"),
    ((1, 3, 4, 4), dict(size=(2, 2), scale=(1.0, -2.0)), "scale must be two positive"),
])
def test_inference_errors_name_the_op(shape, kw, needle):
    g = bz.Graph("t")
    v = g.input("x", bz.Shape(shape))
    with pytest.raises(bz.ShapeError, match=f"resize.*{needle[:20].replace('[', '.')}"):
        g.resize(v, **kw)


def test_linear_resize_of_integers_is_rejected():
    g = bz.Graph("t")
    v = g.input("x", bz.Shape((1, 3, 4, 4), bz.i32))
    with pytest.raises(bz.ShapeError, match="linear resize needs a float input"):
        g.resize(v, (8, 8), mode="linear")


def test_unknown_mode_names_are_builder_errors():
    g = bz.Graph("t")
    v = g.input("x", bz.Shape((1, 3, 4, 4)))
    with pytest.raises(bz.GraphError, match="unknown coordinate transformation mode 'corner'"):
        g.resize(v, (8, 8), coordinate="corner")


def test_text_and_json_round_trip(tmp_path):
    g, _ = run(rand(1, 2, 3, 3), size=(5, 7), mode="cubic", coordinate="align_corners",
               scale=(1.5, 2.5), cubic_a=-0.5, exclude_outside=True)
    op = next(n.op for n in g.nodes if isinstance(n.op, Resize))
    assert op == Resize((5, 7), ResizeMode.CUBIC, CoordinateMode.ALIGN_CORNERS,
                        NearestMode.ROUND_PREFER_FLOOR, (1.5, 2.5), -0.5, True)
    assert bz.Graph.parse(str(g)) == g
    bz.save(g, tmp_path / "r.json")
    assert bz.load(tmp_path / "r.json") == g


# -- Pad modes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_pad_modes_match_numpy(mode):
    x = rand(2, 3, 4)
    g = bz.Graph("t")
    v = g.input("x", bz.Shape(x.shape))
    y = g.pad(v, ((0, 1), (2, 0), (3, 2)), mode=mode)
    g.set_outputs([y])
    assert g.shape_of(y).dims == (3, 5, 9)
    np.testing.assert_array_equal(bz.interpret(g, {"x": x})[0],
                                  np.pad(x, ((0, 1), (2, 0), (3, 2)), mode=mode))
    assert bz.Graph.parse(str(g)) == g


def test_pad_mode_defaults_to_constant_and_old_text_still_parses():
    assert Pad(((1, 1),), 2.0) == Pad(((1, 1),), 2.0, PadMode.CONSTANT)
    g = bz.Graph.parse("graph t(%x: f32[3]) params() {\n  %x = input\n"
                       "  %1 = pad[pads=((1, 2),), value=0.5](%x) -> f32[6]\n  return %1\n}")
    out = bz.interpret(g, {"x": np.ones(3, np.float32)})[0]
    np.testing.assert_array_equal(out, [0.5, 1, 1, 1, 0.5, 0.5])


def test_pads_keep_symbolic_axes_and_reflect_needs_the_smallest_length_to_allow_it():
    """A symbol is at least 2 (braze's assumption), "32*h" at least 64: a reflect pad of a
    symbolic axis imports when its amounts are below that, and runs at every binding."""
    g = bz.Graph("t")
    v = g.input("x", bz.Shape(("n", 4)))
    assert g.shape_of(g.pad(v, ((1, 1), (0, 0)))).dims == ("n+2", 4)
    assert g.shape_of(g.pad(v, ((0, 0), (1, 2)), mode="edge")).dims == ("n", 7)
    assert g.shape_of(g.pad(v, ((1, 1), (0, 0)), mode="reflect")).dims == ("n+2", 4)
    with pytest.raises(bz.ShapeError, match=r"reflect pad of \(2, 2\) on axis 0 needs the axis "
                                            r"at least 3 long, got 'n' \(fix or bound"):
        g.pad(v, ((2, 2), (0, 0)), mode="reflect")
    w = g.input("y", bz.Shape((1, "32*h")))
    y = g.pad(w, ((0, 0), (3, 5)), mode="reflect")
    g.set_outputs([y])
    for h in (1, 2):
        x = rand(1, 32 * h)
        got = bz.interpret(g, {"y": x, "x": rand(2, 4)})[0]
        np.testing.assert_array_equal(got, np.pad(x, ((0, 0), (3, 5)), mode="reflect"))
        np.testing.assert_array_equal(bz.compile(g)({"y": x, "x": rand(2, 4)})[0], got)


def test_reflect_amounts_must_be_below_the_axis_length():
    g = bz.Graph("t")
    v = g.input("x", bz.Shape((3, 4)))
    with pytest.raises(bz.ShapeError, match=r"reflect pad of \(0, 3\) on axis 0 needs the axis "
                                            r"at least 4 long, got 3"):
        g.pad(v, ((0, 3), (0, 0)), mode="reflect")
    with pytest.raises(bz.GraphError, match="unknown pad mode 'wrap'"):
        g.pad(v, ((0, 1), (0, 0)), mode="wrap")
