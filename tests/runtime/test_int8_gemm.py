"""braze's AVX512-VNNI int8 GEMM (kernels/int8_gemm.py) against a NumPy model of the same
integer arithmetic: the per-row u8 quantization bit for bit, the s32 sums bit for bit, the
dequantized f32 result within a few ulps, at sizes that cut across its quads, panels, micro
blocks, K blocks and tiles, on one and two threads; declined operands leave the output
alone."""
import numpy as np
import pytest

from braze.ir.ops.elementwise import Unary, UnaryFn
from braze.runtime.kernels import c_snippets, int8_gemm
from braze.runtime.kernels.threads import ThreadLimit

needs_vnni = pytest.mark.skipif(not int8_gemm.available(), reason="no AVX512-VNNI here")

SIZES = [(m, k, n) for m in (1, 3, 17) for k in (1, 6, 63, 130) for n in (1, 7, 130)] + \
    [(200, 700, 70), (130, 1030, 33), (6, 4, 64)]   # K blocks of 512, tiles of 192 rows


def model_quantize_rows(x):
    """The module docstring's per-row quantization, in NumPy float32 (a row with a NaN: scale
    NaN, zero point 0, values 0)."""
    nan = np.isnan(x).any(axis=1)
    x = np.where(nan[:, None], 0, x).astype(np.float32)
    lo = np.minimum(x.min(axis=1), 0).astype(np.float32)
    hi = np.maximum(x.max(axis=1), 0).astype(np.float32)
    scale = (hi - lo) / np.float32(255)
    scale[scale == 0] = 1
    zp = np.clip(np.rint(-lo / scale), 0, 255)
    q = np.clip(np.rint(x / scale[:, None]) + zp[:, None], 0, 255).astype(np.uint8)
    scale[nan], zp[nan], q[nan] = np.nan, 0, 0
    return q, scale, zp.astype(np.int32)


def model_weight(rng, k, n):
    """Symmetric per-column s8 values and f32 scales."""
    return rng.integers(-127, 128, (k, n)).astype(np.int8), \
        (rng.random(n, dtype=np.float32) + 0.5) / np.float32(127)


def model_dequantized(acc, scale, zp, wq, wscale, bias):
    """f32(acc - zp * colsum) * (row scale * column scale) + bias, in float32."""
    colsum = wq.sum(axis=0, dtype=np.int64)
    v = (acc - zp[:, None].astype(np.int64) * colsum).astype(np.float32)
    v = v * (scale[:, None] * wscale[None, :])
    return v if bias is None else v + bias


def _operands(m, k, n, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, k), dtype=np.float32) + np.float32(0.3))
    wq, ws = model_weight(rng, k, n)
    return x, wq, ws, rng.standard_normal(n, dtype=np.float32)


def _within_ulps(got, want, size, ulps=4):
    """|got - want| within `ulps` float32 ulps of `size` (the terms' magnitude: a bias add
    that cancels keeps the error of its terms)."""
    err = np.abs(got.astype(np.float64) - want)
    room = ulps * np.spacing(np.asarray(size, np.float32))
    assert (err <= room).all(), f"max ulps {np.max(err / room) * ulps:.1f}"


@needs_vnni
def test_rows_quantize_as_the_model_does_bit_for_bit():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 37), dtype=np.float32) * np.float32(3)
    x[1] = 0                          # scale 1, zero point 0
    x[2] = np.abs(x[2])               # min 0: zero point 0
    x[3] = -np.abs(x[3])              # max 0: zero point 255
    x[4, :] = 0.5                     # 0 included in the range
    x[5] = np.round(x[5] * 4) / 4     # exact quarters: ties of x / scale
    x[6] *= np.float32(1e-30)
    x[7] *= np.float32(1e30)
    x[9, 20] = np.nan                 # a NaN row: scale NaN, its products NaN
    q, scale, zp = int8_gemm.quantize_rows(x)
    mq, mscale, mzp = model_quantize_rows(x)
    np.testing.assert_array_equal(q[:, :37], mq)
    assert not q[:, 37:].any()  # the padding to a whole quad is zero
    np.testing.assert_array_equal(scale, mscale)
    np.testing.assert_array_equal(zp, mzp)
    assert zp[1] == 0 and zp[2] == 0 and zp[3] == 255 and np.isnan(scale[9])


@needs_vnni
def test_a_row_with_a_nan_gives_nans_and_leaves_the_other_rows_alone():
    x, wq, ws, bias = _operands(7, 100, 40, 2)
    x[3, 50] = np.nan
    w = int8_gemm.Int8Weight(wq, ws)
    out = np.empty((7, 40), np.float32)
    assert int8_gemm.gemm(x, w, out, bias, c_snippets.ACT_CODES["gelu"],
                          np.empty(int8_gemm.scratch_bytes(7, 100), np.uint8))
    assert np.isnan(out[3]).all() and np.isfinite(np.delete(out, 3, axis=0)).all()


@needs_vnni
@pytest.mark.parametrize("m,k,n", SIZES)
def test_s32_sums_are_exact_on_one_and_two_threads(m, k, n):
    x, wq, ws, _ = _operands(m, k, n, m * 1000 + k * 10 + n)
    q, scale, zp = int8_gemm.quantize_rows(x)
    w = int8_gemm.Int8Weight(wq, ws)
    want = q[:, :k].astype(np.int64) @ wq.astype(np.int64)
    for threads in (1, 2):
        out = np.full((m, n), -7, np.int32)
        with ThreadLimit(threads):
            int8_gemm.gemm_quantized(q, scale, zp, w, out)
        np.testing.assert_array_equal(out, want)


@needs_vnni
@pytest.mark.parametrize("m,k,n", SIZES)
@pytest.mark.parametrize("epilogue", ["none", "bias", "bias_relu"])
def test_f32_result_is_the_models_within_a_few_ulps(m, k, n, epilogue):
    x, wq, ws, bias = _operands(m, k, n, m + 7 * k + n)
    bias = bias if "bias" in epilogue else None
    act = "relu" if "relu" in epilogue else None
    w = int8_gemm.Int8Weight(wq, ws)
    q, scale, zp = model_quantize_rows(x)
    acc = q.astype(np.int64) @ wq.astype(np.int64)
    want = model_dequantized(acc, scale, zp, wq, ws, bias)
    size = np.abs(model_dequantized(acc, scale, zp, wq, ws, None)) + \
        (0 if bias is None else np.abs(bias))
    if act:
        want = np.maximum(want, 0)
    outs = []
    for threads in (1, 2):
        out = np.full((m, n), np.nan, np.float32)
        scratch = np.empty(int8_gemm.scratch_bytes(m, k), np.uint8)
        with ThreadLimit(threads):
            assert int8_gemm.gemm(x, w, out, bias, c_snippets.ACT_CODES[act], scratch)
        _within_ulps(out, want.astype(np.float64), size)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])


@needs_vnni
@pytest.mark.parametrize("act", ["gelu", "gelu_approx", "silu", "tanh", "sigmoid"])
def test_every_epilogue_activation(act):
    x, wq, ws, bias = _operands(3 * 5, 100, 130, 3)
    w = int8_gemm.Int8Weight(wq, ws)
    out = np.full((3, 5, 130), np.nan, np.float32)   # leading dims are rows
    scratch = np.empty(int8_gemm.scratch_bytes(15, 100), np.uint8)
    assert int8_gemm.gemm(x.reshape(3, 5, 100), w, out, bias, c_snippets.ACT_CODES[act],
                          scratch)
    q, scale, zp = model_quantize_rows(x)
    pre = model_dequantized(q.astype(np.int64) @ wq.astype(np.int64), scale, zp, wq, ws, bias)
    want = Unary(UnaryFn(act)).reference(pre.astype(np.float32))
    np.testing.assert_allclose(out.reshape(15, 130), want, rtol=2e-5, atol=2e-6)


@needs_vnni
def test_quantization_error_is_that_of_8_bits():
    """Against the float product: the error a per-row u8 x per-column s8 GEMM should make."""
    x, _, _, _ = _operands(64, 768, 96, 5)
    wf = np.random.default_rng(6).standard_normal((768, 96), dtype=np.float32) / 28
    ws = np.abs(wf).max(axis=0) / np.float32(127)
    wq = np.clip(np.rint(wf / ws), -127, 127).astype(np.int8)
    out = np.empty((64, 96), np.float32)
    assert int8_gemm.gemm(x, int8_gemm.Int8Weight(wq, ws), out, None, 0,
                          np.empty(int8_gemm.scratch_bytes(64, 768), np.uint8))
    exact = x.astype(np.float64) @ wf
    rel = np.abs(out - exact).max() / np.abs(exact).max()
    assert 1e-4 < rel < 2e-2


@needs_vnni
def test_declined_operands_leave_the_output_alone():
    x, wq, ws, bias = _operands(5, 40, 20, 1)
    w = int8_gemm.Int8Weight(wq, ws)
    scratch = np.empty(int8_gemm.scratch_bytes(5, 40), np.uint8)
    out = np.full((5, 20), 3.0, np.float32)
    assert not int8_gemm.gemm(x[:, :39], w, out, None, 0, scratch)                 # k
    assert not int8_gemm.gemm(np.asfortranarray(x), w, out, None, 0, scratch)      # layout
    assert not int8_gemm.gemm(x.astype(np.float64), w, out, None, 0, scratch)      # dtype
    assert not int8_gemm.gemm(x, w, out, bias[:19], 0, scratch)                    # bias
    assert not int8_gemm.gemm(x, w, out, None, 0, scratch[:10])                    # scratch
    assert (out == 3).all()
    q, scale, zp = int8_gemm.quantize_rows(x)
    with pytest.raises(ValueError, match="do not fit the weight"):
        int8_gemm.gemm_quantized(q[:, :36], scale, zp, w, np.empty((5, 20), np.int32))
