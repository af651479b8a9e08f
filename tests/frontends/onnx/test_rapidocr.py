"""Real trained CNNs: the three OCR models shipped in the rapidocr-onnxruntime wheel (PP-OCRv4
text detection (DB: Resize, ConvTranspose), PP-OCRv4 recognition (a PP-LCNetV3 backbone and a
small transformer neck) and the mobile text-direction classifier). Each is imported with a fixed
image size, fused for the CPU target (batch norms and the learnable affine blocks folded into
the convs, every conv one fused_conv_bias_act with its hard-swish / relu / silu, except the
ones named below) and run fused and unfused by the reference interpreter against ONNX Runtime on
the original file, on a rendered text image (random noise gives the detector nothing to see).
Imported with the image size left dynamic as a multiple of the network's stride ("32*h"), each
compiles once and runs at every such size."""
from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
_SPEC = importlib.util.find_spec("rapidocr_onnxruntime")
if _SPEC is None or not _SPEC.submodule_search_locations:
    pytest.skip("rapidocr-onnxruntime is not installed (it is in the test extra: "
                "pip install -e '.[test]')", allow_module_level=True)
from PIL import Image, ImageDraw, ImageFont  # noqa: E402  (a rapidocr dependency)

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

MODELS = Path(_SPEC.submodule_search_locations[0]) / "models"
CASES = {
    "det": ("ch_PP-OCRv4_det_infer.onnx", (1, 3, 64, 96)),
    "rec": ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 160)),
    "cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192)),
}
TOLERANCE = 1e-4  # of the output's scale (its largest magnitude)


def text_image(h: int, w: int, text: str = "braze OCR 42") -> np.ndarray:
    """Black text on white, normalized as rapidocr does ((pixel / 255 - 0.5) / 0.5), NCHW."""
    img = Image.new("RGB", (w, h), (255, 255, 255))
    font = ImageFont.load_default(size=max(8, int(h * 0.45)))
    ImageDraw.Draw(img).text((3, h * 0.2), text, fill=(0, 0, 0), font=font)
    a = np.asarray(img, np.float32) / 255.0
    return np.ascontiguousarray(((a - 0.5) / 0.5).transpose(2, 0, 1)[None])


class Model:
    def __init__(self, name: str):
        file, self.shape = CASES[name]
        self.path = MODELS / file
        self.graph = bz.import_onnx(self.path, input_shapes={"x": self.shape})
        self.fused, self.report = bz.fuse(self.graph, "cpu")
        self.x = text_image(*self.shape[2:])
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(self.path), so, providers=["CPUExecutionProvider"])
        (self.ref,) = sess.run(None, {"x": self.x})

    def missed(self, pattern: str) -> list:
        return [m for m in self.report.missed if m.pattern == pattern]


@pytest.fixture(scope="module")
def models():
    return {}


def _get(models: dict, name: str) -> Model:
    if name not in models:
        models[name] = Model(name)
    return models[name]


@pytest.fixture(params=sorted(CASES))
def model(request, models) -> Model:
    return _get(models, request.param)


# -- import -------------------------------------------------------------------------------------
def test_import_keeps_every_conv_and_the_file_names_as_provenance(model):
    import onnx

    proto = onnx.load(str(model.path), load_external_data=False)
    onnx_counts = Counter(n.op_type for n in proto.graph.node)
    g = model.graph
    assert g.count("conv2d") == onnx_counts["Conv"]
    assert g.count("conv_transpose2d") == onnx_counts.get("ConvTranspose", 0)
    assert g.count("batch_norm") == onnx_counts.get("BatchNormalization", 0)
    names = {n.name for n in proto.graph.node}
    convs = [n for n in g.nodes if n.op.kind == "conv2d"]
    assert all(n.provenance in names or n.provenance.startswith("Conv") for n in convs)


def test_detector_upsamplings_are_2x_nearest_or_general_resizes(models):
    g = _get(models, "det").graph
    assert g.count("resize_nearest_2x") == 4  # Resize(scales 2, asymmetric, floor)
    scales = sorted(n.op.scale for n in g.nodes if n.op.kind == "resize")
    assert scales == [(4.0, 4.0), (8.0, 8.0)]


def test_unfixed_image_size_says_to_pass_input_shapes():
    with pytest.raises(FrontendError, match=r"p2o\.Conv\.0 .*input_shapes=\{\"x\": "
                                            r"\(1, 3, 224, 224\)\}.* multiples .*"
                                            r"input_shapes=\{\"x\": \(\"batch\", 3, "
                                            r"\"32\*h\", \"32\*w\"\)\}"):
        bz.import_onnx(MODELS / CASES["det"][0])


DYNAMIC = {"det": ("batch", 3, "32*h", "32*w"), "rec": ("batch", 3, 48, "8*w"),
           "cls": ("batch", 3, 48, "8*w")}
SIZES = {"det": [(1, 3, 64, 96), (2, 3, 96, 160)], "rec": [(1, 3, 48, 160), (2, 3, 48, 96)],
         "cls": [(1, 3, 48, 192), (3, 3, 48, 104)]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_dynamic_image_size_as_multiples_of_the_stride(name):
    """One import, one compile, every image size that is a multiple of the network's stride:
    compiled and reference results match ONNX Runtime on the original file at each size."""
    path = MODELS / CASES[name][0]
    g = bz.import_onnx(path, input_shapes={"x": DYNAMIC[name]})
    assert g.inputs[0].op.shape.dims == DYNAMIC[name]
    fused, _ = bz.fuse(g, "cpu")
    assert fused.count("fused_conv_bias_act") == Model(name).fused.count("fused_conv_bias_act")
    exe = bz.compile(g, target="cpu")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for shape in SIZES[name]:
        x = np.concatenate([text_image(*shape[2:])] * shape[0])
        x[1:] += np.random.default_rng(shape[3]).standard_normal(x[1:].shape).astype(np.float32)
        (want,) = sess.run(None, {"x": x})
        (got,) = exe({"x": x})
        assert _relative_error(got, want) < TOLERANCE, shape
        (ref,) = bz.interpret(fused, {"x": x})
        assert _relative_error(ref, want) < TOLERANCE, shape


def test_dynamic_image_size_refuses_a_size_that_is_not_a_multiple():
    g = bz.import_onnx(MODELS / CASES["det"][0], input_shapes={"x": DYNAMIC["det"]})
    x = text_image(70, 96)
    with pytest.raises(bz.InterpretError, match=r"input 'x' .* dim 32\*h must be a multiple "
                                                r"of 32, but was fed 70"):
        bz.compile(g, target="cpu")({"x": x})


# -- fusion -------------------------------------------------------------------------------------
def test_every_batch_norm_and_affine_block_folds_into_its_conv(model):
    counts = model.fused.op_counts()
    assert "batch_norm" not in counts
    assert not model.missed("FoldConvBatchNorm") and not model.missed("FoldConvAffine")


def test_every_conv_fuses_with_its_bias_and_activation_except_the_named_ones(model):
    g, fused = model.graph, model.fused
    convs = g.count("conv2d")
    acts = Counter(n.op.act.value if n.op.act else None for n in fused.nodes
                   if n.op.kind == "fused_conv_bias_act")
    left = [n for n in fused.nodes if n.op.kind == "conv2d"]
    if model.path.name.startswith("ch_PP-OCRv4_det"):
        # The FPN's eight RSE layers: a bias-free 3x3 / 1x1 conv whose output feeds both a
        # global average pool (the squeeze-excite gate) and the residual sum, so nothing
        # follows it alone that could join it. The residual sum is no bias, so no near miss.
        assert len(left) == 8
        for n in left:
            assert not n.op.has_bias
            assert "global_avg_pool" in {u.op.kind for u in fused.users(n)}
        assert model.missed("FuseConvBiasAct") == []
        # the two transposed convs of the DB head have no fused kind; their bias-add and batch
        # norm fold into them instead
        assert fused.count("conv_transpose2d") == 2
        assert all(n.op.has_bias for n in fused.nodes if n.op.kind == "conv_transpose2d")
        assert acts == {"hard_swish": 24, "relu": 11, None: 19}
    else:
        assert not left
        want = {"ch_PP-OCRv4_rec_infer.onnx": {"hard_swish": 28, "silu": 5, "relu": 2, None: 3},
                "ch_ppocr_mobile_v2.0_cls_infer.onnx": {"hard_swish": 18, "relu": 15,
                                                        None: 20}}[model.path.name]
        assert acts == want
    assert sum(acts.values()) == convs - len(left)


# -- numerics -----------------------------------------------------------------------------------
def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


@pytest.mark.parametrize("which", ["graph", "fused"])
def test_matches_onnxruntime_on_a_text_image(model, which):
    (out,) = bz.interpret(getattr(model, which), {"x": model.x})
    assert _relative_error(out, model.ref) < TOLERANCE


def test_detector_finds_the_text_and_recognizer_reads_what_ort_reads(models):
    det = _get(models, "det")
    assert 0.05 < (det.ref > 0.3).mean() < 0.5  # the input really has text in it
    (prob,) = bz.interpret(det.fused, {"x": det.x})
    np.testing.assert_array_equal(prob > 0.3, det.ref > 0.3)
    rec = _get(models, "rec")
    (probs,) = bz.interpret(rec.fused, {"x": rec.x})
    np.testing.assert_array_equal(probs.argmax(-1), rec.ref.argmax(-1))


def test_dynamic_image_size_survives_onnx_export(tmp_path):
    """The fused detector with its symbolic size exports to an ONNX file that ONNX Runtime
    runs at any multiple of 32 (sizes as Shape arithmetic, resizes by scale)."""
    path = MODELS / CASES["det"][0]
    fused, _ = bz.fuse(bz.import_onnx(path, input_shapes={"x": DYNAMIC["det"]}), "cpu")
    bz.export_onnx(fused, tmp_path / "det.onnx")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ours = ort.InferenceSession(str(tmp_path / "det.onnx"), so,
                                providers=["CPUExecutionProvider"])
    theirs = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for shape in SIZES["det"]:
        x = np.concatenate([text_image(*shape[2:])] * shape[0])
        (got,), (want,) = ours.run(None, {"x": x}), theirs.run(None, {"x": x})
        assert _relative_error(got, want) < TOLERANCE, shape
