"""attention_amx's AMX attention core against NumPy with the same bf16 roundings (q, k, v and
the probabilities): head dims with and without padding, GQA, odd lengths, causal, sliding
window, padding masks with -inf, softcap, fewer queries than keys, strided views of a packed
QKV buffer written merged, several key chunks; and the f32 kernel's results where rounding
changes nothing."""
import ml_dtypes
import numpy as np
import pytest

from braze.runtime.kernels import attention_amx, attention_native

pytestmark = pytest.mark.skipif(not attention_amx.available(),
                                reason="no AMX-BF16 (or no tile permission / C compiler) here")

F32_MIN = np.finfo(np.float32).min


def _bf16(a):
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


def _reference(q, k, v, scale, causal=False, window=0, mask=None, softcap=None, round_p=True):
    """Attention with bf16-rounded q, k, v and (round_p) probabilities; f32 elsewhere."""
    rep = q.shape[1] // k.shape[1]
    k, v = (np.repeat(_bf16(a), rep, axis=1).astype(np.float64) for a in (k, v))
    s = _bf16(q).astype(np.float64) @ k.swapaxes(-1, -2) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    sq, sk = s.shape[-2:]
    if causal:
        rows, cols = np.arange(sq)[:, None] + sk - sq, np.arange(sk)[None, :]
        hidden = cols > rows
        if window:
            hidden |= cols <= rows - window
        s = np.where(hidden, F32_MIN, s)
    if mask is not None:
        s = s + mask
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(mx), mx, 0))
    p = (e / np.maximum(e.sum(-1, keepdims=True), 1e-300)).astype(np.float32)
    want = (_bf16(p) if round_p else p).astype(np.float64) @ v
    return want, _flip_slack(p, v) if round_p else 0.0


def _flip_slack(p, v):
    """How far bf16(p) @ v may move where p lies within f32 noise (the kernel's exp and sum
    order) of a bf16 rounding midpoint, so that the kernel may round it the other way."""
    lo = (p.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
    ulp = np.ldexp(1.0, np.frexp(np.maximum(lo, 1e-38))[1] - 8)
    near = np.abs(p - (lo + ulp / 2)) <= 1e-6 * p   # a few f32 ulps
    return (near * ulp) @ np.abs(v)


def _strides(*arrays):
    return sum((attention_native.head_strides(a) for a in arrays), ())


def _run(q, k, v, scale, causal=False, window=0, mask=None, softcap=None, out=None,
         kernel="amx"):
    b, hq, sq, d = q.shape
    hkv, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    shape = (b, hq, hkv, sq, sk, d, dv)
    plan = attention_amx.AmxHeadsPlan(shape) if kernel == "amx" else \
        attention_native.HeadsPlan(shape)
    out = np.full((b, hq, sq, dv), np.nan, np.float32) if out is None else out
    mst = (0, 0, 0, 0)
    if mask is not None:
        mask = np.ascontiguousarray(mask, np.float32)
        mst = tuple(s // 4 if n != 1 else 0 for s, n in zip(mask.strides, mask.shape))
    scratch = np.empty(plan.scratch_shape, np.float32)
    attention_native.attn_heads(plan, q, k, v, out, _strides(q, k, v, out), scale,
                                softcap or 0.0, causal, window, mask, mst, scratch)
    return out


def _inputs(b, hq, hkv, sq, sk, d, dv=None, seed=0):
    rng = np.random.default_rng(seed)
    dv = dv or d
    return (rng.standard_normal((b, hq, sq, d), np.float32),
            rng.standard_normal((b, hkv, sk, d), np.float32),
            rng.standard_normal((b, hkv, sk, dv), np.float32))


def _close(got, want, tol=1e-5):
    """got within tol * (1 + max|want|) of want = (values, slack for p rounding flips)."""
    want, slack = want if isinstance(want, tuple) else (want, 0.0)
    err = np.abs(got - want) - slack
    assert err.max() <= tol * (1 + np.abs(want).max()), err.max()


@pytest.mark.parametrize("d", [64, 80, 32])
@pytest.mark.parametrize("s", [1, 7, 33, 128])
@pytest.mark.parametrize("hkv", [4, 2, 1])
def test_matches_bf16_reference(hkv, s, d):
    q, k, v = _inputs(2, 4, hkv, s, s, d, seed=s + d)
    for causal in (False, True):
        _close(_run(q, k, v, d ** -0.5, causal), _reference(q, k, v, d ** -0.5, causal))


@pytest.mark.parametrize("d", [64, 80])
def test_sliding_window_and_softcap(d):
    q, k, v = _inputs(2, 4, 2, 70, 70, d)
    _close(_run(q, k, v, 0.125, True, window=9), _reference(q, k, v, 0.125, True, window=9))
    _close(_run(q, k, v, 0.125, softcap=2.0), _reference(q, k, v, 0.125, softcap=2.0))
    _close(_run(q, k, v, 0.125, True, window=20, softcap=3.0),
           _reference(q, k, v, 0.125, True, window=20, softcap=3.0))


def test_padding_mask_with_minus_inf_rows():
    q, k, v = _inputs(2, 4, 1, 33, 33, 64)
    rng = np.random.default_rng(1)
    mask = np.where(rng.random((2, 1, 1, 33)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[0, ..., :5] = -1e9
    _close(_run(q, k, v, 0.125, mask=mask), _reference(q, k, v, 0.125, mask=mask))
    mask[1] = -np.inf   # every key hidden: zeros
    got = _run(q, k, v, 0.125, mask=mask)
    assert np.all(got[1] == 0)
    want, slack = _reference(q, k, v, 0.125, mask=mask)
    _close(got[0], (want[0], slack[0]))


def test_mask_per_head_and_row_and_value_width_apart_from_d():
    q, k, v = _inputs(2, 4, 2, 45, 45, 64, dv=40)   # dv padded to 48: 3 column tiles
    mask = np.random.default_rng(2).standard_normal((1, 4, 45, 45)).astype(np.float32)
    _close(_run(q, k, v, 0.125, mask=mask), _reference(q, k, v, 0.125, mask=mask))
    _close(_run(q, k, v, 0.125, True, mask=mask), _reference(q, k, v, 0.125, True, mask=mask))


def test_fewer_queries_than_keys_and_more():
    q, k, v = _inputs(1, 4, 2, 5, 40, 64)
    _close(_run(q, k, v, 0.125, True), _reference(q, k, v, 0.125, True))
    q, k, v = _inputs(1, 4, 2, 40, 5, 80)   # rows that see no key: uniform bf16(1/5) on bf16(v)
    _close(_run(q, k, v, 0.125, True), _reference(q, k, v, 0.125, True))


def test_packed_qkv_views_written_merged():
    b, s, hq, hkv, d = 2, 37, 4, 2, 64
    rng = np.random.default_rng(2)
    qkv = rng.standard_normal((b, s, (hq + 2 * hkv) * d), np.float32)
    heads = qkv.reshape(b, s, hq + 2 * hkv, d).transpose(0, 2, 1, 3)
    q, k, v = heads[:, :hq], heads[:, hq:hq + hkv], heads[:, hq + hkv:]
    merged = np.full((b, s, hq * d), np.nan, np.float32)
    out = merged.reshape(b, s, hq, d).transpose(0, 2, 1, 3)
    _run(q, k, v, 0.125, True, out=out)
    _close(out, _reference(q, k, v, 0.125, True))
    assert not np.isnan(merged).any()


@pytest.mark.parametrize("causal, window", [(False, 0), (True, 0), (True, 300)])
def test_several_key_chunks(causal, window):
    q, k, v = _inputs(1, 4, 2, 600, 600, 64)
    # rows seeing more than one chunk round their unnormalized probabilities: bf16's relative
    # error (2^-9) of the output's scale, not f32's
    _close(_run(q, k, v, 0.125, causal, window), _reference(q, k, v, 0.125, causal, window),
           tol=2e-3)


def test_one_chunk_of_600_keys_is_exact(monkeypatch):
    monkeypatch.setattr(attention_native, "KEY_BLOCK", 1024)
    q, k, v = _inputs(1, 2, 1, 600, 600, 32)
    _close(_run(q, k, v, 0.125, True, 300), _reference(q, k, v, 0.125, True, 300))


def test_f32_kernel_where_rounding_changes_nothing():
    """bf16-exact q, k, v and one key per causal row's step that takes all the weight: the
    probabilities are 0 or 1 (exact in bf16), so both kernels give the same numbers."""
    q, k, v = (_bf16(a) for a in _inputs(2, 4, 2, 33, 33, 64))
    scale = 1e4   # softmax saturates to one-hot rows
    want = _run(q, k, v, scale, True, kernel="f32")
    np.testing.assert_allclose(_run(q, k, v, scale, True), want, rtol=1e-6, atol=1e-6)
    q, k, v = (_bf16(a) for a in _inputs(1, 2, 1, 300, 300, 32, seed=4))
    want = _run(q, k, v, scale, True, kernel="f32")   # several key chunks
    np.testing.assert_allclose(_run(q, k, v, scale, True), want, rtol=1e-6, atol=1e-6)
    q, k, v = (_bf16(a) for a in _inputs(2, 4, 4, 20, 20, 32, seed=3))
    want = _run(q, k, v, 0.125, kernel="f32")   # general p: within bf16 rounding of p
    _close(_run(q, k, v, 0.125), want, tol=4e-3)


@pytest.mark.parametrize("case", ["plain", "causal_no_key_rows", "gqa_mask_chunks"])
def test_bf16_operands_and_output_give_the_f32_paths_numbers(case):
    """q, k, v handed over as bf16 values (in16) and the output written rounded to bf16
    (out16), as a fused block's AMX projections use them: bit for bit the f32 path's result
    on the same values, rounded (the kernel rounds its f32 operands exactly so). Causal with
    more queries than keys takes the no-key rows' mean of the bf16 values."""
    b, hq, hkv, sq, sk, d, causal, masked = {
        "plain": (2, 4, 4, 40, 40, 64, False, False),
        "causal_no_key_rows": (1, 2, 2, 37, 20, 32, True, False),
        "gqa_mask_chunks": (2, 4, 2, 24, 300, 48, False, True)}[case]
    q, k, v = (_bf16(a) for a in _inputs(b, hq, hkv, sq, sk, d, seed=5))
    mask = None
    if masked:
        mask = np.zeros((b, 1, 1, sk), np.float32)
        mask[0, ..., -7:] = -np.inf
    want = _run(q, k, v, d ** -0.5, causal=causal, mask=mask)
    shape = (b, hq, hkv, sq, sk, d, d)
    plan = attention_amx.AmxHeadsPlan(shape, in16=True, out16=True)
    q16, k16, v16 = (a.astype(ml_dtypes.bfloat16) for a in (q, k, v))
    out = np.full((b, hq, sq, d), np.nan, ml_dtypes.bfloat16)
    strides = sum((tuple(s // 2 for s in a.strides[:3]) for a in (q16, k16, v16, out)), ())
    mst = (0, 0, 0, 0) if mask is None else (sk, 0, 0, 1)
    scratch = np.empty(plan.scratch_shape, np.float32)
    attention_native.attn_heads(plan, q16, k16, v16, out, strides, d ** -0.5, 0.0, causal, 0,
                                mask, mst, scratch)
    np.testing.assert_array_equal(out.view(np.uint16),
                                  want.astype(ml_dtypes.bfloat16).view(np.uint16))
