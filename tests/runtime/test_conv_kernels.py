"""Conv-family kernels against the reference interpreter on random float32 inputs with odd sizes:
conv2d and fused_conv_bias_act (im2col + GEMM, 1x1 direct GEMM, depthwise; stride, asymmetric
padding, dilation, groups, every epilogue activation), conv_transpose2d, max / average pooling,
global average pooling, resize_nearest_2x and resize (nearest, linear, cubic). Each case is
compiled as built (fuse=False) and the dispatch report must show the node on a native kernel."""
import json

import numpy as np
import pytest

import braze as bz
from braze.ir.ops.elementwise import UnaryFn
from braze.runtime.kernels import Dispatch, conv_native, gemm_choice
from braze.runtime.kernels.pool_resize import resample_taps

pytestmark = pytest.mark.skipif(conv_native.lib() is None, reason="no C compiler on this machine")


def _compiled_matches(g, kind, tol=2e-5, seeds=(0, 1)):
    """Compile `g` unfused, compare with the interpreter on fresh feeds, and return the
    implementation names of the `kind` nodes (each must run a native kernel)."""
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, fuse=False)
    for seed in seeds:
        feeds = bz.random_feeds(g, seed)
        want = bz.interpret(g, feeds, params)
        got = exe(feeds)
        for a, w in zip(got, want, strict=True):
            scale = max(1.0, float(np.abs(w).max()))
            np.testing.assert_allclose(a, w, rtol=tol, atol=tol * scale)
    rows = [r for r in exe.dispatch_report().rows if r[1] == kind]
    assert rows, f"no {kind} node in the executed graph"
    assert {d for _, _, d, _ in rows} == {Dispatch.NATIVE}, rows
    return {impl for _, _, _, impl in rows}


def _conv_graph(n, c, h, w, o, k, *, stride=1, padding=0, dilation=1, groups=1, bias=True,
                fused_act="none"):
    g = bz.Graph("conv")
    x = g.input("x", bz.Shape((n, c, h, w)))
    kh, kw = (k, k) if isinstance(k, int) else k
    wt = g.param("w", bz.Shape((o, c // groups, kh, kw)))
    b = g.param("b", bz.Shape((o,))) if bias else None
    if fused_act == "none":
        y = g.conv2d(x, wt, b, stride, padding, dilation, groups)
    else:
        y = g.fused_conv_bias_act(x, wt, b, stride, padding, dilation, groups, act=fused_act)
    g.set_outputs([y])
    return g


CONV_CASES = {
    # name: (n, c, h, w, o, kernel, attributes, implementation)
    "3x3 same": (1, 5, 11, 13, 7, 3, dict(padding=1), "im2col"),
    "stride 2, asymmetric pad": (1, 6, 13, 9, 8, 3, dict(stride=2, padding=(0, 1, 1, 0)),
                                 "im2col"),
    "dilation 2": (1, 4, 15, 11, 6, 3, dict(padding=2, dilation=2), "im2col"),
    "rect kernel, stride (2, 1)": (1, 3, 9, 17, 5, (1, 5), dict(stride=(2, 1),
                                                                 padding=(0, 2, 0, 2)), "im2col"),
    "groups 3": (1, 9, 7, 11, 12, 3, dict(padding=1, groups=3), "im2col"),
    "batch 3": (3, 4, 7, 9, 5, 3, dict(padding=(1, 0, 1, 2)), "im2col"),
    "1x1": (2, 12, 7, 9, 10, 1, dict(), "1x1 conv"),
    "1x1 groups 2": (1, 8, 5, 7, 6, 1, dict(groups=2), "1x1 conv"),
    "1x1 stride 2": (1, 8, 9, 7, 6, 1, dict(stride=2), "im2col"),
    "depthwise 3x3": (1, 7, 13, 11, 7, 3, dict(padding=1, groups=7), "depthwise"),
    "depthwise 5x5 stride 2": (2, 6, 15, 13, 6, 5, dict(stride=2, padding=(2, 1, 2, 3),
                                                        groups=6), "depthwise"),
    "depthwise dilated": (1, 4, 11, 12, 4, 3, dict(padding=2, dilation=2, groups=4),
                          "depthwise"),
    "depthwise multiplier 2": (1, 3, 9, 10, 6, 3, dict(stride=(1, 2), padding=1, groups=3),
                               "depthwise"),
    "depthwise wide rows": (2, 5, 6, 150, 5, 3, dict(padding=1, groups=5), "depthwise"),
    "depthwise wide, stride (1, 2) dilated": (1, 4, 7, 141, 8, 3, dict(
        stride=(1, 2), padding=(0, 3, 1, 2), dilation=(1, 3), groups=4), "depthwise"),
    "depthwise stride (2, 1), 5x5": (1, 6, 11, 70, 6, 5, dict(stride=(2, 1), padding=2,
                                                               groups=6), "depthwise"),
    "depthwise stride 3 over padding": (1, 3, 5, 8, 3, 3, dict(stride=3, padding=4,
                                                                 groups=3), "depthwise"),
    "no bias": (1, 5, 9, 9, 4, 3, dict(padding=1, bias=False), "im2col"),
    "one input channel, 40 filters": (1, 1, 1, 203, 40, (1, 10), dict(stride=(1, 5)),
                                      "im2col"),
    # braze's conv tiles: whole tiles written in place, K blocks across taps, K = 1024 rows
    "1x1 tiles in place": (2, 12, 8, 10, 20, 1, dict(), "1x1 conv"),
    "3x3, 50 channels": (1, 50, 9, 12, 14, 3, dict(padding=1), "im2col"),
    "1x1, 1024 channels": (1, 1024, 4, 4, 8, 1, dict(), "1x1 conv"),
}


@pytest.fixture(params=gemm_choice.CONV_CHOICES)
def conv_path(request, monkeypatch):
    """Each GEMM conv path in turn (BRAZE_CONV forces the measured choice)."""
    monkeypatch.setenv("BRAZE_CONV", request.param)
    return request.param


def _expected(impl: str, path: str, groups: int) -> str | None:
    """The implementation a case's GEMM conv runs on `path` (depthwise has its own loop; the
    pixel-row form takes one group only: grouped convs then run one of the others, None)."""
    if impl == "depthwise":
        return impl
    if path == "rows":
        return "pixel rows" if groups == 1 else None
    return "braze conv tiles" if path == "shifted" else impl


def _check_impl(name: str, impl: str, path: str, attrs: dict) -> None:
    want = _expected(impl, path, attrs.get("groups", 1))
    assert want is None or want in name, (want, name)


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv2d(case, conv_path):
    n, c, h, w, o, k, attrs, impl = CONV_CASES[case]
    g = _conv_graph(n, c, h, w, o, k, **attrs)
    (name,) = _compiled_matches(g, "conv2d")
    _check_impl(name, impl, conv_path, attrs)


@pytest.mark.parametrize("case", ["3x3 same", "stride 2, asymmetric pad", "groups 3", "1x1"])
def test_conv_tiles_with_weights_fed_at_run_time(case, monkeypatch):
    """A weight that is not static (an input) goes to taps-major order on every call."""
    monkeypatch.setenv("BRAZE_CONV", "shifted")
    n, c, h, w, o, k, attrs, _ = CONV_CASES[case]
    kh, kw = (k, k) if isinstance(k, int) else k
    groups = attrs.get("groups", 1)
    g = bz.Graph("conv_fed_weight")
    x = g.input("x", bz.Shape((n, c, h, w)))
    wt = g.input("w", bz.Shape((o, c // groups, kh, kw)))
    b = g.param("b", bz.Shape((o,)))
    g.set_outputs([g.conv2d(x, wt, b, attrs.get("stride", 1), attrs.get("padding", 0),
                            attrs.get("dilation", 1), groups)])
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, fuse=False)
    for seed in (0, 1):
        feeds = bz.random_feeds(g, seed)
        (want,) = bz.interpret(g, feeds, params)
        (got,) = exe(feeds)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max()))
    assert any("braze conv tiles" in r[3] for r in exe.dispatch_report().rows)


_ACTS = sorted((a for a in conv_native.ACTIVATIONS if a is not None), key=lambda a: a.value)


@pytest.mark.parametrize("act", [None, *_ACTS, UnaryFn.EXP], ids=lambda a: str(a and a.value))
@pytest.mark.parametrize("case", ["stride 2, asymmetric pad", "1x1", "depthwise 5x5 stride 2",
                                  "depthwise wide rows", "1x1 tiles in place"])
def test_fused_conv_bias_act(case, act, conv_path):
    """Every activation the C epilogue applies, and one it leaves to NumPy (exp: applied after
    the native conv by fused.then_activation, as after a GEMM), on each path."""
    n, c, h, w, o, k, attrs, impl = CONV_CASES[case]
    g = _conv_graph(n, c, h, w, o, k, fused_act=act, **attrs)
    (name,) = _compiled_matches(g, "fused_conv_bias_act", tol=5e-5)
    assert name.endswith(", then NumPy exp") == (act is UnaryFn.EXP), name
    _check_impl(name, impl, conv_path, attrs)


def _residual_conv_graph(n, c, h, w, o, k, act, *, bias=True, **attrs):
    """act(conv(x) + b + r) as one fused node; r is computed (tanh of an input), its buffer
    free after the conv reads it."""
    probe = _conv_graph(n, c, h, w, o, k, bias=False, **attrs)
    out = probe.shape_of(probe.outputs[0])  # the conv's output type
    g = bz.Graph("conv_residual")
    x = g.input("x", bz.Shape((n, c, h, w)))
    kh, kw = (k, k) if isinstance(k, int) else k
    groups = attrs.get("groups", 1)
    wt = g.param("w", bz.Shape((o, c // groups, kh, kw)))
    b = g.param("b", bz.Shape((o,))) if bias else g.constant(np.zeros(o, np.float32))
    r = g.tanh(g.input("r", bz.Shape(out.dims)))
    g.set_outputs([g.fused_conv_bias_act(x, wt, b, attrs.get("stride", 1),
                                         attrs.get("padding", 0), attrs.get("dilation", 1),
                                         groups, act=act, residual=r)])
    return g


@pytest.mark.parametrize("act", [None, UnaryFn.RELU, UnaryFn.SILU, UnaryFn.EXP],
                         ids=lambda a: str(a and a.value))
@pytest.mark.parametrize("case", ["stride 2, asymmetric pad", "1x1", "depthwise 5x5 stride 2",
                                  "depthwise wide rows", "1x1 tiles in place", "groups 3",
                                  "3x3, 50 channels", "batch 3"])
def test_fused_conv_with_a_residual(case, act, conv_path):
    """The residual joins each path's epilogue before the activation (exp: the NumPy one
    after it); the pixel-row form adds it, then the activation, as its NHWC product goes back
    to NCHW."""
    n, c, h, w, o, k, attrs, impl = CONV_CASES[case]
    g = _residual_conv_graph(n, c, h, w, o, k, act, **attrs)
    (name,) = _compiled_matches(g, "fused_conv_bias_act", tol=5e-5)
    assert "residual" in name
    _check_impl(name, impl, conv_path, attrs)


def test_fused_conv_stays_one_node_when_compiled():
    """With a kernel registered, compile no longer decomposes fused_conv_bias_act."""
    g = _conv_graph(1, 4, 9, 9, 6, 3, padding=1, fused_act=UnaryFn.HARD_SWISH)
    exe = bz.compile(g, params=bz.init_params(g, 0))
    exe(bz.random_feeds(g, 0))
    assert not exe.dispatch_report().decomposed
    assert [k for _, k, _, _ in exe.dispatch_report().rows] == ["fused_conv_bias_act"]


TRANSPOSE_CASES = {
    "stride 2": (1, 6, 5, 7, 4, 3, dict(stride=2, padding=1, output_padding=1)),
    "asymmetric pad, dilation": (2, 4, 6, 5, 3, 3, dict(stride=(2, 1), padding=(1, 0, 0, 2),
                                                        dilation=(1, 2))),
    "groups 2, kernel 4": (1, 6, 7, 6, 4, 4, dict(stride=2, padding=1, groups=2)),
    "stride 1, no bias": (1, 3, 8, 9, 5, 3, dict(bias=False)),
}


@pytest.mark.parametrize("case", sorted(TRANSPOSE_CASES))
def test_conv_transpose2d(case):
    n, c, h, w, og, k, attrs = TRANSPOSE_CASES[case]
    attrs = dict(attrs)
    bias, groups = attrs.pop("bias", True), attrs.get("groups", 1)
    g = bz.Graph("deconv")
    x = g.input("x", bz.Shape((n, c, h, w)))
    wt = g.param("w", bz.Shape((c, og, k, k)))
    b = g.param("b", bz.Shape((og * groups,))) if bias else None
    g.set_outputs([g.conv_transpose2d(x, wt, b, **attrs)])
    _compiled_matches(g, "conv_transpose2d")


POOL_CASES = [
    ("max", 3, 2, (1, 1, 1, 1), False, (2, 5, 13, 11)),
    ("max", 2, 2, 0, False, (2, 5, 13, 11)),
    ("max", 3, 1, (0, 1, 2, 0), False, (2, 5, 13, 11)),
    ("avg", 3, 2, (1, 0, 0, 1), False, (2, 5, 13, 11)),
    ("avg", 3, 2, (1, 0, 0, 1), True, (2, 5, 13, 11)),
    ("avg", (2, 3), (1, 2), 0, False, (2, 5, 13, 11)),
    ("max", 3, 2, (1, 1, 1, 1), False, (1, 4, 37, 70)),
    ("avg", (3, 5), (3, 2), (2, 1, 0, 2), False, (1, 3, 17, 41)),
    ("avg", 5, 1, (2, 2, 2, 2), True, (1, 2, 9, 33)),
]


@pytest.mark.parametrize("kind, kernel, stride, padding, include_pad, shape", POOL_CASES)
def test_pool2d(kind, kernel, stride, padding, include_pad, shape):
    g = bz.Graph("pool")
    x = g.input("x", bz.Shape(shape))
    g.set_outputs([g.pool(x, kind, kernel, stride, padding, count_include_pad=include_pad)])
    _compiled_matches(g, f"{kind}_pool2d")


@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (1, 3, 160, 161)])
def test_global_avg_pool(shape):
    g = bz.Graph("gap")
    x = g.input("x", bz.Shape(shape))
    g.set_outputs([g.global_avg_pool(x)])
    assert _compiled_matches(g, "global_avg_pool") == {"C plane means"}


def test_resize_nearest_2x():
    g = bz.Graph("up")
    x = g.input("x", bz.Shape((2, 3, 7, 5)))
    g.set_outputs([g.resize_nearest_2x(x)])
    assert _compiled_matches(g, "resize_nearest_2x", tol=0) == {"C nearest gather"}
    g = bz.Graph("up64")  # other dtypes: NumPy's broadcast copy
    x = g.input("x", bz.Shape((1, 2, 3, 4), bz.f64))
    g.set_outputs([g.resize_nearest_2x(x)])
    assert _compiled_matches(g, "resize_nearest_2x", tol=0) == {"NumPy broadcast copy"}


RESIZE_CASES = [
    ("nearest", "half_pixel", "round_prefer_floor", (17, 23), None),
    ("nearest", "asymmetric", "floor", (14, 10), (2.0, 2.0)),
    ("nearest", "align_corners", "round_prefer_ceil", (5, 4), None),
    ("linear", "half_pixel", "round_prefer_floor", (17, 23), None),
    ("linear", "align_corners", "round_prefer_floor", (13, 6), None),
    ("linear", "asymmetric", "round_prefer_floor", (4, 3), None),
    ("linear", "pytorch_half_pixel", "round_prefer_floor", (1, 19), None),
    ("cubic", "half_pixel", "round_prefer_floor", (19, 15), None),
]


@pytest.mark.parametrize("mode, coordinate, nearest, size, scale", RESIZE_CASES)
def test_resize(mode, coordinate, nearest, size, scale):
    g = bz.Graph("resize")
    x = g.input("x", bz.Shape((2, 3, 7, 5)))
    g.set_outputs([g.resize(x, size, mode, coordinate, nearest, scale)])
    (name,) = _compiled_matches(g, "resize", tol=0 if mode == "nearest" else 2e-5)
    assert ("gather" if mode == "nearest" else "separable") in name


def test_resample_taps_rebuild_the_matrix():
    rng = np.random.default_rng(0)
    m = np.zeros((9, 6))
    for r in range(9):
        lo = rng.integers(0, 5)
        m[r, lo:lo + rng.integers(1, 3)] = rng.random()
    m[3] = 0.0
    start, weights = resample_taps(m)
    rebuilt = np.zeros_like(m)
    for r in range(9):
        rebuilt[r, start[r]:start[r] + weights.shape[1]] += weights[r]
    np.testing.assert_allclose(rebuilt, m, rtol=1e-6)


# -- real trained CNNs: the rapidocr-onnxruntime OCR models, compiled vs ONNX Runtime ----------
CONV_FAMILY = {"conv2d", "fused_conv_bias_act", "conv_transpose2d", "max_pool2d", "avg_pool2d",
               "global_avg_pool", "resize", "resize_nearest_2x"}


@pytest.fixture(scope="module")
def rapidocr():
    """(models folder, cases, text image maker) from the rapidocr import tests."""
    pytest.importorskip("onnxruntime")
    import importlib.util

    if importlib.util.find_spec("rapidocr_onnxruntime") is None:
        pytest.skip("rapidocr-onnxruntime is not installed (pip install -e '.[test]')")
    from tests.frontends.onnx.test_rapidocr import CASES, MODELS, text_image

    return MODELS, CASES, text_image


@pytest.mark.parametrize("name", ["det", "rec", "cls"])
def test_rapidocr_models_compiled_match_onnxruntime(rapidocr, name):
    import onnxruntime as ort

    models, cases, text_image = rapidocr
    file, shape = cases[name]
    g = bz.import_onnx(models / file, input_shapes={"x": shape})
    exe = bz.compile(g, "cpu")
    x = text_image(*shape[2:])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(models / file), so, providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"x": x})
    (got,) = exe({"x": x})
    scale = float(np.abs(want).max())
    assert np.abs(got - want).max() <= 1e-4 * scale
    rows = [r for r in exe.dispatch_report().rows if r[1] in CONV_FAMILY]
    assert sum(1 for r in rows if r[1] == "fused_conv_bias_act") >= 20
    assert [r for r in rows if r[2] != Dispatch.NATIVE] == []


def test_the_conv_choice_is_measured_once_per_geometry_and_remembered(monkeypatch, tmp_path):
    """Without BRAZE_CONV the GEMM conv path is measured (braze's tiles, the pixel-row form,
    im2col + MKL where it is there) the first time a geometry and epilogue are seen, saved
    under their key, and read back."""
    from braze.runtime.kernels import blas
    from braze.runtime.kernels.conv import ConvGeometry, conv_choice, conv_key, conv_paths

    monkeypatch.delenv("BRAZE_CONV", raising=False)
    monkeypatch.setenv("BRAZE_GEMM_CHOICES", str(tmp_path / "choices.json"))
    monkeypatch.setattr(gemm_choice, "_choices", None)
    g = _conv_graph(1, 6, 12, 10, 8, 3, padding=1, fused_act=UnaryFn.RELU)
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, fuse=False)
    feeds = bz.random_feeds(g, 0)
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds, params)[0], rtol=2e-5,
                               atol=2e-5)
    geo = ConvGeometry(1, 6, 12, 10, 8, 6, 3, 3, 12, 10, 1, (1, 1), (1, 1, 1, 1), (1, 1))
    relu = conv_native.ACTIVATIONS[UnaryFn.RELU]
    key = conv_key(geo, relu, True, conv_paths(geo, True, blas.sgemm_address() is not None))
    (impl,) = {r[3] for r in exe.dispatch_report().rows if r[1] == "fused_conv_bias_act"}
    saved = json.loads((tmp_path / "choices.json").read_text())
    assert set(saved) == {key} and saved[key] in gemm_choice.CONV_CHOICES
    names = {"shifted": "braze conv tiles", "rows": "pixel rows", "im2col": "im2col"}
    assert names[saved[key]] in impl
    paths = conv_paths(geo, True, blas.sgemm_address() is not None)
    other = next(p for p in paths if p != saved[key])
    saved[key] = other  # read back, not measured
    (tmp_path / "choices.json").write_text(json.dumps(saved))
    monkeypatch.setattr(gemm_choice, "_choices", None)
    assert conv_choice(geo, relu, True, paths) == other


@pytest.mark.parametrize("geometry", [
    (1, 96, 480, 480, 96, 3, 3, 480, 480, (1, 1), (1, 1, 1, 1), (1, 1)),
    (4, 64, 56, 56, 64, 3, 3, 28, 28, (2, 2), (1, 1, 1, 1), (1, 1)),
    (2, 3, 640, 641, 16, 7, 5, 318, 321, (2, 2), (2, 1, 0, 3), (1, 1)),
    (1, 32, 200, 90, 32, 3, 3, 196, 86, (1, 1), (0, 0, 0, 0), (2, 2)),
    (1, 8, 9, 9, 8, 3, 3, 9, 9, (1, 1), (1, 1, 1, 1), (1, 1)),
])
def test_the_conv_measured_for_a_choice_is_small_and_consistent(geometry):
    """A large conv's choice is measured on one image and the first output rows only (bounded
    work), a conv whose padding, stride and dilation give exactly those rows."""
    from braze.runtime.kernels.conv import MEASURED_MACS, ConvGeometry, measured_geometry

    n, c, h, w, o, kh, kw, ho, wo, stride, padding, dilation = geometry
    geo = ConvGeometry(n, c, h, w, o, c, kh, kw, ho, wo, 1, stride, padding, dilation)
    m = measured_geometry(geo)
    sh, dh = m.stride[0], m.dilation[0]
    pt, pl, pb, pr = m.padding
    assert m.n == 1 and (m.c, m.w, m.o, m.wo, m.kh, m.kw) == (c, w, o, wo, kh, kw)
    assert (pt, pl, pr) == (padding[0], padding[1], padding[3]) and pb >= 0
    assert (m.h + pt + pb - dh * (kh - 1) - 1) // sh + 1 == m.ho <= ho
    macs = m.o * m.ho * m.wo * m.cg * kh * kw
    assert macs <= max(MEASURED_MACS, o * wo * c * kh * kw)  # at most one row past the budget
    if n == 1 and o * ho * wo * c * kh * kw <= MEASURED_MACS:
        assert m == geo
    g = bz.Graph("measured")  # a valid conv: the builder infers the same output
    x = g.input("x", bz.Shape((1, c, m.h, m.w)))
    wt = g.param("w", bz.Shape((o, c, kh, kw)))
    y = g.conv2d(x, wt, None, m.stride, m.padding, m.dilation, 1)
    assert tuple(g.shape_of(y).dims) == (1, o, m.ho, m.wo)


def test_a_new_image_size_takes_the_path_measured_at_a_similar_one(monkeypatch, tmp_path):
    """A conv's path is measured once per geometry; a new image size (a dynamic-size CNN
    re-planned for each) within a factor of 2 in H x W takes the path recorded for the
    nearest size, and a size further away is measured."""
    from braze.runtime.kernels import gemm_choice

    monkeypatch.delenv("BRAZE_CONV", raising=False)
    monkeypatch.setenv("BRAZE_GEMM_CHOICES", str(tmp_path / "choices.json"))
    monkeypatch.setattr(gemm_choice, "_choices", None)
    measured = []
    monkeypatch.setattr(gemm_choice, "_agreed",
                        lambda runs: measured.append(list(runs)) or list(runs)[-1])
    names = []
    for h, w in ((40, 40), (48, 44), (36, 52), (160, 160)):
        (name,) = _compiled_matches(_conv_graph(1, 16, h, w, 24, 3, padding=1), "conv2d",
                                    seeds=(0,))
        names.append(name)
    if not measured:
        pytest.skip("one conv path here: nothing is measured")
    assert len(measured) == 2  # 40x40 and 160x160; the two sizes near 40x40 reuse its path
    assert names[0] == names[1] == names[2]
    keys = sorted(gemm_choice._load())
    assert len(keys) == 2 and ":1x16x40x40:" in keys[0] + keys[1]
