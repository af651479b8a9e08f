"""A strided CNN imported from PyTorch with its image size dynamic: declared a multiple of the
network's stride ("32*h", or torch's derived dim 32 * Dim("h")), every size inside it stays a
polynomial (FloorDiv(32*h - 1, 2) + 1 = 16*h), so one import and one compile run every such
size, matching PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import braze as bz  # noqa: E402
from braze.errors import FrontendError, InterpretError  # noqa: E402


class Net(torch.nn.Module):
    """Stride-2 convs, a padded pool, an FPN-style nearest upsampling and sum."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 8, 3, 2, 1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, 2, 1)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)
        self.lateral = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x):
        a = torch.relu(self.c1(x))                   # H / 2
        b = self.pool(torch.relu(self.c2(a)))        # H / 8
        up = torch.nn.functional.interpolate(b, scale_factor=4, mode="nearest")
        return self.lateral(up) + a + torch.nn.functional.avg_pool2d(a, 2).repeat_interleave(
            2, dim=2).repeat_interleave(2, dim=3)            # H / 2 each


SIZES = [(1, 3, 32, 64), (2, 3, 96, 32)]


def _check(g, net, sizes=SIZES):
    exe = bz.compile(g, target="cpu")
    for shape in sizes:
        x = torch.randn(*shape)
        with torch.no_grad():
            want = net(x).numpy()
        got = exe({"x": x.numpy()})[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(bz.interpret(g, {"x": x.numpy()})[0], want, rtol=1e-4,
                                   atol=1e-5)
    return exe


def test_braze_form_multiple_of_a_name():
    net = Net().eval()
    g = bz.import_torch(net, (torch.randn(2, 3, 64, 96),),
                        dynamic_shapes={"x": {0: "batch", 2: "32*h", 3: "32*w"}})
    assert g.inputs[0].op.shape.dims == ("batch", 3, "32*h", "32*w")
    assert g.count("resize") == 1  # nearest by 4: one resize, the source index i // 4
    exe = _check(g, net)
    with pytest.raises(InterpretError, match="must be a multiple of 32, but was fed 40"):
        exe({"x": np.zeros((1, 3, 40, 64), np.float32)})


def test_torch_derived_dims():
    from torch.export import Dim

    net = Net().eval()
    h, w = Dim("h", min=1, max=64), Dim("w", min=1, max=64)
    g = bz.import_torch(net, (torch.randn(1, 3, 64, 96),),
                        dynamic_shapes={"x": {2: 32 * h, 3: 32 * w}})
    assert g.inputs[0].op.shape.dims == (1, 3, "32*h", "32*w")
    _check(g, net, [(1, 3, 32, 64), (1, 3, 96, 32)])


@pytest.mark.parametrize("root", ["len", "N", "E", "max"])
def test_a_multiple_of_a_name_sympy_reserves_keeps_that_name(root):
    """torch reads Dim names with sympy, where "len" is a builtin and "E" Euler's number."""
    net = Net().eval()
    g = bz.import_torch(net, (torch.randn(1, 3, 64, 96),),
                        dynamic_shapes={"x": {2: f"32*{root}", 3: "32*w"}})
    assert g.inputs[0].op.shape.dims == (1, 3, f"32*{root}", "32*w")
    _check(g, net, [(1, 3, 32, 64), (1, 3, 96, 32)])


def test_a_plain_dynamic_size_names_the_multiple_to_declare():
    with pytest.raises(FrontendError, match=r"conv2d with stride 2 needs H static or declared a "
                                            r"multiple of the stride .*'32\*h'"):
        bz.import_torch(torch.nn.Conv2d(3, 4, 3, 2, 1).eval(), (torch.randn(1, 3, 64, 96),),
                        dynamic_shapes={"input": {2: "h", 3: "w"}})


def test_a_dim_spec_that_is_neither_a_name_nor_a_multiple_is_refused():
    with pytest.raises(FrontendError, match=r"'h\+1': dims must be names .* or a multiple"):
        bz.import_torch(Net().eval(), (torch.randn(1, 3, 64, 96),),
                        dynamic_shapes={"x": {2: "h+1"}})


@pytest.mark.parametrize("width,why", [(32, r"which makes w = 1 \(torch.export treats 0 and 1"),
                                       (80, "not a multiple of 32")])
def test_an_example_size_that_is_no_multiple_of_two_or_more_names_the_example(width, why):
    """torch.export calls a root of 1 (32 for "32*w") a violated constraint of the model's code;
    braze says the example is at fault, and which size to export with."""
    with pytest.raises(FrontendError, match=rf"dim 3 of input 'x' was named '32\*w' but the "
                                            rf"example's size there is {width}, {why}.*e\.g\. 64"):
        bz.import_torch(Net().eval(), (torch.randn(1, 3, 64, width),),
                        dynamic_shapes={"x": {2: "32*h", 3: "32*w"}})


class Bilinear(torch.nn.Module):
    def __init__(self, align_corners: bool):
        super().__init__()
        torch.manual_seed(1)
        self.align_corners = align_corners
        self.down = torch.nn.Conv2d(3, 4, 3, 2, 1)
        self.deeper = torch.nn.Conv2d(4, 4, 3, 2, 1)

    def forward(self, x):
        a = self.down(x)
        up = torch.nn.functional.interpolate(self.deeper(a), scale_factor=2, mode="bilinear",
                                             align_corners=self.align_corners)
        return up + a


@pytest.mark.parametrize("align_corners", [False, True])
def test_bilinear_upsampling_of_a_dynamic_size(align_corners):
    net = Bilinear(align_corners).eval()
    g = bz.import_torch(net, (torch.randn(2, 3, 64, 96),),
                        dynamic_shapes={"x": {0: "batch", 2: "32*h", 3: "32*w"}})
    assert g.count("resize") == 1
    _check(g, net)


@pytest.mark.parametrize("pool", [torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True),
                                  torch.nn.MaxPool2d(3, 2, 0, ceil_mode=True),
                                  torch.nn.AvgPool2d(3, 2, 1, ceil_mode=True),
                                  torch.nn.AvgPool2d(3, 2, 1, ceil_mode=True,
                                                     count_include_pad=False)])
def test_ceil_mode_pooling_of_a_dynamic_size(pool):
    """The ceil extension of a window over "32*h" is a constant (torch's output length minus
    the floor one), so the pool keeps torch's size (16*h+1 for k3 s2 p1)."""
    g = bz.import_torch(pool.eval(), (torch.randn(2, 3, 64, 96),),
                        dynamic_shapes={"input": {0: "batch", 2: "32*h", 3: "32*w"}})
    exe = bz.compile(g, target="cpu")
    for shape in SIZES:
        x = torch.randn(*shape)
        want = pool(x).numpy()
        got = exe({"input": x.numpy()})[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale,mode", [(0.5, "nearest"), (0.5, "bilinear"), (0.25, "nearest"),
                                        (1.5, "nearest")])
def test_interpolate_by_a_fraction_of_a_dynamic_size(scale, mode):
    """torch writes the size trunc(scale * float(32*h)); over a power-of-two denominator that
    divides the size's coefficients it is a polynomial (0.5: 16*h, 1.5: 48*h)."""
    class Resize(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.interpolate(x, scale_factor=scale, mode=mode)

    g = bz.import_torch(Resize(), (torch.randn(2, 3, 64, 96),),
                        dynamic_shapes={"x": {0: "batch", 2: "32*h", 3: "32*w"}})
    assert g.shape_of(g.outputs[0]).dims[2] == f"{int(32 * scale)}*h"
    _check(g, Resize())


@pytest.mark.parametrize("pool", [torch.nn.AdaptiveAvgPool2d((2, 4)), torch.nn.AdaptiveMaxPool2d(2),
                                  torch.nn.AdaptiveAvgPool2d(1)])
def test_adaptive_pooling_of_a_dynamic_size_that_the_output_divides(pool):
    """A pyramid pooling module's adaptive pools over "32*h": blocks of 16*h rows when the
    output is 2 (a reshape and a reduction; the window would be a symbolic kernel)."""
    g = bz.import_torch(pool.eval(), (torch.randn(2, 3, 64, 96),),
                        dynamic_shapes={"input": {0: "batch", 2: "32*h", 3: "32*w"}})
    exe = bz.compile(g, target="cpu")
    for shape in SIZES:
        x = torch.randn(*shape)
        want = pool(x)
        np.testing.assert_allclose(exe({"input": x.numpy()})[0], want.numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_adaptive_pooling_to_a_size_that_does_not_divide_names_the_multiple():
    with pytest.raises(FrontendError, match=r"adaptive pooling of \('32\*h', '32\*w'\) to "
                                            r"\[3, 3\] .* divides the input for every size "
                                            r"\(declare it a multiple, e.g. '48\*h'\)"):
        bz.import_torch(torch.nn.AdaptiveAvgPool2d(3).eval(), (torch.randn(2, 3, 64, 96),),
                        dynamic_shapes={"input": {0: "batch", 2: "32*h", 3: "32*w"}})


def test_an_audio_encoder_with_a_dynamic_length_as_a_multiple_of_its_stride():
    """wav2vec2's feature extractor (strided conv1d: 5, 2, 2, 2, 2, 2, 2; total stride 320) over
    a length declared "320*t" gives t-1 frames for every t; one compile runs every length."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=64, conv_dim=(16,) * 7,
                                      num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2)
    torch.manual_seed(0)
    model = transformers.Wav2Vec2Model(cfg).eval()

    class Frames(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_values):
            return self.model(input_values).last_hidden_state

    net = Frames().eval()
    g = bz.import_torch(net, (torch.randn(2, 320 * 20),),
                        dynamic_shapes={"input_values": {0: "batch", 1: "320*t"}})
    assert g.shape_of(g.outputs[0]).dims == ("batch", "t-1", 32)
    exe = bz.compile(g, target="cpu")
    for n, t in ((1, 12), (3, 25)):
        x = torch.randn(n, 320 * t)
        with torch.no_grad():
            want = net(x).numpy()
        got = exe({"input_values": x.numpy()})[0]
        assert got.shape == (n, t - 1, 32)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=5e-5)


class _Bilinear(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return torch.nn.functional.interpolate(x, mode="bilinear", **self.kw)


@pytest.mark.parametrize("kw", [dict(scale_factor=0.5), dict(size=(1, 2)), dict(size=(1, 1)),
                                dict(scale_factor=0.5, recompute_scale_factor=True)])
def test_bilinear_downscaling_to_one_row_matches_torch(kw):
    """torch reads source row (0 + 0.5) * 2 - 0.5 = 0.5 (the mean of both rows) for a single
    output row; ONNX's pytorch_half_pixel reads row 0 there, and braze had imported it so."""
    m = _Bilinear(**kw)
    x = np.random.default_rng(0).standard_normal((1, 2, 2, 4)).astype(np.float32)
    g = bz.import_torch(m, (torch.from_numpy(x),))
    want = m(torch.from_numpy(x)).numpy()
    for got in (bz.interpret(g, {"x": x})[0], bz.compile(g)({"x": x})[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_bilinear_downscaling_of_a_dynamic_size_to_one_row_matches_torch():
    """Scale 0.5 of "2*h" rows is h rows: one at h = 1, which torch still interpolates."""
    m = _Bilinear(scale_factor=0.5)
    g = bz.import_torch(m, (torch.randn(2, 3, 8, 6),),
                        dynamic_shapes={"x": {0: "b", 2: "2*h", 3: "2*w"}})
    for shape in ((1, 3, 2, 6), (2, 3, 2, 2), (1, 3, 10, 4)):
        x = np.random.default_rng(shape[2]).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(bz.interpret(g, {"x": x})[0],
                                   m(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


class _NearestExact(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return torch.nn.functional.interpolate(x, mode="nearest-exact", **self.kw)


@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(scale_factor=0.5),
                                dict(scale_factor=1.5), dict(size=(5, 7)), dict(size=(1, 3)),
                                dict(scale_factor=(3, 0.75))])
def test_nearest_exact_interpolation_matches_torch(kw):
    """`nearest-exact` reaches braze whole (one resize, half-pixel source rows) instead of
    torch's decomposition, static at several scales and sizes."""
    m = _NearestExact(**kw)
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 8)).astype(np.float32)
    g = bz.import_torch(m, (torch.from_numpy(x),))
    assert g.count("resize") == 1
    np.testing.assert_array_equal(bz.interpret(g, {"x": x})[0], m(torch.from_numpy(x)).numpy())


def test_nearest_exact_upsampling_of_a_dynamic_size():
    """torch's decomposition of `nearest-exact` computes float(h); imported whole, its output
    size 2*h stays a polynomial, so a dynamic image size imports (it was refused)."""
    m = _NearestExact(scale_factor=2)
    g = bz.import_torch(m, (torch.randn(2, 3, 4, 5),),
                        dynamic_shapes={"x": {0: "b", 2: "h", 3: "w"}})
    for shape in ((1, 3, 3, 7), (2, 3, 1, 2)):
        x = np.random.default_rng(shape[2]).standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(bz.interpret(g, {"x": x})[0],
                                      m(torch.from_numpy(x)).numpy())


class _Nearest1d(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return torch.nn.functional.interpolate(x, **self.kw)


@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(scale_factor=3, mode="nearest-exact"),
                                dict(scale_factor=0.5), dict(size=7),
                                dict(size=5, mode="nearest-exact"), dict(scale_factor=1.5)])
def test_nearest_1d_interpolation_matches_torch(kw):
    """1-D nearest / nearest-exact (audio, sequence upsampling) is one resize of x viewed
    [N, C, 1, L], bit for bit torch's."""
    m = _Nearest1d(**kw)
    x = np.random.default_rng(0).standard_normal((2, 3, 6)).astype(np.float32)
    g = bz.import_torch(m, (torch.from_numpy(x),))
    assert g.count("resize") == 1
    np.testing.assert_array_equal(bz.interpret(g, {"x": x})[0], m(torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_nearest_1d_upsampling_of_a_dynamic_length(mode):
    """torch's decomposition computed float(L) (refused); kept whole, the output length 2*L is
    a polynomial, so a dynamic sequence length imports and runs every length."""
    m = _Nearest1d(scale_factor=2, mode=mode)
    g = bz.import_torch(m, (torch.randn(2, 3, 5),), dynamic_shapes={"x": {0: "b", 2: "seq"}})
    exe = bz.compile(g)
    for shape in ((1, 3, 1), (3, 3, 8)):
        x = np.random.default_rng(shape[2]).standard_normal(shape).astype(np.float32)
        want = m(torch.from_numpy(x)).numpy()
        for got in (bz.interpret(g, {"x": x})[0], exe({"x": x})[0]):
            np.testing.assert_array_equal(got, want)


class _Bicubic(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return torch.nn.functional.interpolate(x, mode="bicubic", **self.kw)


@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(scale_factor=0.5), dict(size=(1, 3)),
                                dict(size=(7, 9)), dict(scale_factor=1.5),
                                dict(scale_factor=2, align_corners=True),
                                dict(size=(5, 5), align_corners=True)])
def test_bicubic_interpolation_matches_torch(kw):
    """Bicubic (ViT position embeddings resized to the image) is one cubic resize with torch's
    coefficient and source coordinates, single output rows included."""
    m = _Bicubic(**kw)
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 8)).astype(np.float32)
    g = bz.import_torch(m, (torch.from_numpy(x),))
    assert g.count("resize") == 1
    np.testing.assert_allclose(bz.interpret(g, {"x": x})[0], m(torch.from_numpy(x)).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_bicubic_upsampling_of_a_dynamic_size():
    """torch's decomposition of bicubic truncates float sizes (math.trunc, refused); kept
    whole, a dynamic image size imports and runs, interpreted and compiled."""
    m = _Bicubic(scale_factor=2)
    g = bz.import_torch(m, (torch.randn(2, 3, 4, 5),),
                        dynamic_shapes={"x": {0: "b", 2: "h", 3: "w"}})
    exe = bz.compile(g)
    for shape in ((1, 3, 1, 2), (2, 3, 6, 3)):
        x = np.random.default_rng(shape[2]).standard_normal(shape).astype(np.float32)
        want = m(torch.from_numpy(x)).numpy()
        for got in (bz.interpret(g, {"x": x})[0], exe({"x": x})[0]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
