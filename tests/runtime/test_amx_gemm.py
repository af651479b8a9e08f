"""braze's AMX bf16 GEMM (kernels/amx_gemm.py): exact bf16 products accumulated in f32, against
NumPy at sizes that are not multiples of the 32 x 32 blocks, with every epilogue; declined
operands leave the output alone; the models forced onto it, and which bf16 GEMM a shape runs:
test_dpbf16_gemm.py."""

import ml_dtypes
import numpy as np
import pytest

from braze.runtime.kernels import amx_gemm, bf16_gemm, c_snippets

needs_amx = pytest.mark.skipif(not amx_gemm.available(), reason="no AMX-BF16 here")


def _bf16(a):
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


@needs_amx
@pytest.mark.parametrize("rows,k,n", [(1, 1, 1), (5, 13, 7), (37, 45, 71), (33, 64, 32),
                                      (300, 96, 200), (128, 768, 80)])
@pytest.mark.parametrize("epilogue", ["none", "bias", "bias_gelu", "silu"])
def test_matches_numpy(rows, k, n, epilogue):
    rng = np.random.default_rng(rows + 7 * k + n)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = _bf16(rng.standard_normal((k, n), dtype=np.float32))
    bias = rng.standard_normal(n, dtype=np.float32) if "bias" in epilogue else None
    act = {"bias_gelu": "gelu", "silu": "silu"}.get(epilogue)
    out = np.full((rows, n), np.nan, np.float32)
    x16 = np.empty(amx_gemm.scratch_elems(rows, k), np.uint16)
    assert amx_gemm.gemm(x, amx_gemm.AmxWeight(w), out, bias, c_snippets.ACT_CODES[act], x16)
    want = _bf16(x).astype(np.float64) @ w
    if bias is not None:
        want = want + bias
    if act:
        from braze.ir.ops.elementwise import Unary, UnaryFn

        with np.errstate(over="ignore"):
            want = Unary(UnaryFn(act)).reference(want.astype(np.float32))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


@needs_amx
@pytest.mark.parametrize("rows,k,n", [(200, 64, 48), (256, 96, 40), (96, 64, 1000),
                                      (130, 40, 24), (33, 64, 32), (1030, 128, 72)])
@pytest.mark.parametrize("out16", [False, True])
def test_bf16_operand_matches_numpy_split_by_rows_or_columns(rows, k, n, out16):
    """An operand of bf16 values (the hand-off) read in place in whole 32-row blocks and
    copied for the rest (or all copied where k is no multiple of 32), through both the row
    split (an operand tall against the weight) and the column split; f32 or bf16 out."""
    rng = np.random.default_rng(rows + k + n)
    x = ml_dtypes.bfloat16(rng.standard_normal((rows, k)))
    w = _bf16(rng.standard_normal((k, n), dtype=np.float32))
    bias = rng.standard_normal(n, dtype=np.float32)
    out = np.full((rows, n), np.nan, ml_dtypes.bfloat16 if out16 else np.float32)
    x16 = np.zeros(amx_gemm.scratch_elems(rows, k), np.uint16)
    assert amx_gemm.gemm(x, amx_gemm.AmxWeight(w), out, bias, 0, x16)
    want = x.astype(np.float64) @ w + bias
    tol = 2.0 ** -8 if out16 else 1e-5
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=tol, atol=tol * np.sqrt(k))


@needs_amx
def test_operands_that_do_not_fit_are_declined_untouched():
    w = amx_gemm.AmxWeight(np.ones((40, 24), np.float32))
    out = np.full((3, 24), 7.0, np.float32)
    x16 = np.empty(amx_gemm.scratch_elems(3, 40), np.uint16)
    x = np.ones((3, 40), np.float32)
    assert not amx_gemm.gemm(np.ones((3, 41), np.float32), w, out, None, 0, x16)       # k
    assert not amx_gemm.gemm(x, w, out, None, 0, x16[:3 * 40])                          # scratch
    assert not amx_gemm.gemm(x, w, out, np.ones(23, np.float32), 0, x16)                # bias
    assert not amx_gemm.gemm(np.ones((40, 3), np.float32).T, w, out, None, 0, x16)      # strides
    assert (out == 7.0).all()
    assert amx_gemm.gemm(x, w, out, None, 0, x16) and (out == 40.0).all()


def test_prepared_weights_start_on_a_cache_line():
    """Every packed weight starts 64-byte aligned (NumPy gives 16: each 64-byte tile or panel
    row would then straddle two cache lines)."""
    from braze.runtime.kernels import dpbf16_gemm, mkl_packed, packed_gemm

    rng = np.random.default_rng(3)
    for shape in ((40, 72), (33, 17), (256, 96)):
        w = ml_dtypes.bfloat16(rng.standard_normal(shape)).astype(np.float32)
        packed = [packed_gemm.pack(w).panels]
        if amx_gemm.available():
            packed.append(amx_gemm.AmxWeight(w).packed)
        if dpbf16_gemm.available():
            packed.append(dpbf16_gemm.DpWeight(w).packed)
        if bf16_gemm._mkl() is not None:
            packed.append(bf16_gemm.Bf16Weight(w).packed)
        if mkl_packed.pack(w) is not None:
            packed.append(mkl_packed.pack(w).packed)
        assert len(packed) > 1 or not amx_gemm.available()
        assert all(p.ctypes.data % 64 == 0 for p in packed), [p.ctypes.data % 64 for p in packed]


@needs_amx
@pytest.mark.parametrize("rows,k,f", [(1, 32, 16), (37, 64, 21), (70, 40, 48), (33, 96, 5)])
@pytest.mark.parametrize("gate_first", [True, False])
@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_gated_epilogue_matches_numpy(rows, k, f, gate_first, act):
    """act(gate) * up from a [k, 2F] weight packed in gate / up pairs, F odd sizes included,
    with a bias; f32 out, and bf16 out (that result rounded; the GELU's own form aside)."""
    rng = np.random.default_rng(rows + k + f)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = ml_dtypes.bfloat16(rng.standard_normal((k, 2 * f))).astype(np.float32)
    b = rng.standard_normal(2 * f).astype(np.float32)
    h = ml_dtypes.bfloat16(x).astype(np.float32).astype(np.float64) @ w + b
    gate, up = (h[:, :f], h[:, f:]) if gate_first else (h[:, f:], h[:, :f])
    if act == "silu":
        want = gate / (1 + np.exp(-gate)) * up
    else:
        from scipy.special import erf
        want = 0.5 * gate * (1 + erf(gate / np.sqrt(2))) * up
    weight = amx_gemm.AmxWeight(w, gate_first)
    assert weight.gated and weight.out_cols == f and weight.n == 2 * (-(-f // 16) * 16)
    from braze.runtime.kernels.packed_gemm import gate_up_pairs
    bias = gate_up_pairs(b, gate_first)
    x16 = np.zeros(amx_gemm.scratch_elems(rows, k), np.uint16)
    code = c_snippets.ACT_CODES[act]
    out = np.full((rows, f), np.nan, np.float32)
    assert amx_gemm.gemm(x, weight, out, bias, code, x16)
    scale = np.abs(want).max()
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5 * scale)
    out16 = np.full((rows, f), np.nan, ml_dtypes.bfloat16)
    assert amx_gemm.gemm(x, weight, out16, bias, code, x16)
    np.testing.assert_allclose(out16.astype(np.float32), want, rtol=2 ** -8, atol=1e-5 * scale)
    assert not amx_gemm.gemm(x, weight, out, bias, 0, x16)  # gated needs its activation
    assert not amx_gemm.gemm(x, weight, np.empty((rows, 2 * f), np.float32), bias, code, x16)
