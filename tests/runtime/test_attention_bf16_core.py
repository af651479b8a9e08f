"""The bf16 policy's attention core: the attention op's `round_operands` (a fused block's
`round_core`) rounds q, k, v and the probabilities to bf16 before their matmuls. The reference,
the decomposition and the compiled C kernel compute the same numbers: masks of every kind, GQA,
softcap, head dims off the register tiles, several key chunks, causal rows that see no key."""
import ml_dtypes
import numpy as np
import pytest

import braze as bz
import braze.models as models
from braze.ir.ops.attention import Attention, MaskKind
from braze.passes.precision import PrecisionPolicy, apply_precision
from braze.runtime.kernels import attention_amx, attention_dp, attention_native


def _bf(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


def _graph(b, hq, hkv, sq, sk, d, kind="none", window=0, softcap=None, rounding=bz.bf16):
    g = bz.Graph("attn")
    q = g.input("q", bz.Shape((b, hq, sq, d)))
    k = g.input("k", bz.Shape((b, hkv, sk, d)))
    v = g.input("v", bz.Shape((b, hkv, sk, d)))
    ins = [q, k, v]
    if MaskKind(kind).takes_input:
        ins.append(g.input("m", bz.Shape((b, 1, 1, sk))))
    op = Attention(MaskKind(kind), window, None, softcap, rounding)
    g.set_outputs([g.add_node(op, ins)[0]])
    return g


def _feeds(g, seed, masked_keys=0):
    feeds = bz.random_feeds(g, seed)
    if "m" in feeds:
        feeds["m"] = np.zeros_like(feeds["m"])
        feeds["m"][..., :masked_keys] = -np.inf
    return feeds


def test_reference_rounds_q_k_v_and_the_probabilities():
    g = _graph(2, 4, 2, 5, 7, 16)
    feeds = _feeds(g, 0)
    q, k, v = (feeds[n] for n in "qkv")
    k2, v2 = (np.repeat(_bf(a), 2, axis=1) for a in (k, v))
    s = _bf(q) @ k2.swapaxes(-1, -2) / 4.0
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = _bf(p) @ v2
    got = bz.interpret(g, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    plain = bz.interpret(_graph(2, 4, 2, 5, 7, 16, rounding=None), feeds)[0]
    assert np.abs(plain - got).max() > 1e-4  # the rounding is not a no-op


def test_decomposition_writes_the_casts():
    g = _graph(1, 2, 2, 6, 6, 8, "causal")
    node = next(n for n in g.nodes if n.op.kind == "attention")
    d = bz.Graph("d")
    ins = [d.input(name, g.shape_of(v)) for name, v in zip("qkv", node.inputs)]
    d.set_outputs([node.op.decompose(d, ins)])
    casts = [n for n in d.nodes if n.op.kind == "cast" and n.op.dtype == bz.bf16]
    assert len(casts) == 4  # q, k, v, the probabilities
    feeds = _feeds(g, 3)
    np.testing.assert_allclose(bz.interpret(d, feeds)[0], bz.interpret(g, feeds)[0], rtol=1e-5,
                               atol=1e-6)


def test_round_operands_must_be_a_float_dtype():
    with pytest.raises(bz.BrazeError, match="round_operands must be a float dtype"):
        _graph(1, 2, 2, 3, 3, 8, rounding=bz.i32)


needs_c = pytest.mark.skipif(attention_native.lib() is None, reason="no C compiler")


@pytest.fixture(params=["amx", "dp", "micro-kernels"])
def core(request, monkeypatch):
    """Each C core: the AMX kernel where it runs, the AVX512-BF16 one where it runs (and AMX is
    set aside), and attn_heads_bf16 (the f32 micro-kernels on rounded values), which runs
    everywhere else."""
    if request.param == "amx" and not attention_amx.available():
        pytest.skip("no AMX here")
    if request.param == "dp" and not attention_dp.available():
        pytest.skip("no AVX512-BF16 here")
    if request.param != "amx":
        monkeypatch.setattr(attention_amx, "available", lambda: False)
    if request.param == "micro-kernels":
        monkeypatch.setattr(attention_dp, "available", lambda: False)
    return {"amx": "AMX", "dp": "AVX512-BF16", "micro-kernels": "micro-kernels"}[request.param]


@needs_c
@pytest.mark.parametrize("shape, kind, window, softcap", [
    ((2, 4, 4, 33, 33, 64), "none", 0, None),
    ((2, 4, 2, 17, 17, 80), "causal", 0, None),
    ((1, 4, 1, 40, 40, 32), "sliding_window", 9, None),
    ((2, 4, 4, 9, 9, 64), "custom", 0, None),
    ((1, 2, 2, 12, 12, 24), "none", 0, 20.0),
    ((1, 2, 2, 5, 40, 64), "causal", 0, None),     # decode-like: fewer queries than keys
    ((1, 2, 2, 9, 4, 16), "causal", 0, None),      # rows that see no key: the mean of v
], ids=["plain", "causal-gqa-d80", "window-mqa", "padding-mask", "softcap", "decode",
        "no-key-rows"])
def test_compiled_core_matches_the_reference(shape, kind, window, softcap, core):
    g = _graph(*shape, kind=kind, window=window, softcap=softcap)
    exe = bz.compile(g, fuse=False)
    impl = next(i for _, k, _, i in exe.dispatch_report(_feeds(g, 0)).rows if k == "attention")
    assert "bf16-rounded" in impl and core in impl
    for seed in (0, 1):
        feeds = _feeds(g, seed, masked_keys=3)
        want = bz.interpret(g, feeds)[0]
        got = exe(feeds)[0]
        # same bf16 operands, f32 sums in another order: a probability can round the other way
        assert np.abs(got - want).max() < 4e-3 * np.abs(want).max() + 1e-6
        assert np.abs(got - want).mean() < 1e-3 * np.abs(want).mean() + 1e-6
        unrounded = bz.interpret(_graph(*shape, kind=kind, window=window, softcap=softcap,
                                        rounding=None), feeds)[0]
        assert np.abs(got - want).mean() < 0.5 * np.abs(unrounded - want).mean() + 1e-7


@needs_c
def test_several_key_chunks_round_each_chunks_probabilities(core):
    """Past one key chunk the kernel rounds each chunk's unnormalized probabilities (the
    reference rounds the normalized ones): close, not bit-equal."""
    g = _graph(1, 2, 2, 20, 600, 64, "custom")
    exe = bz.compile(g, fuse=False)
    feeds = _feeds(g, 5, masked_keys=300)
    want = bz.interpret(g, feeds)[0]
    got = exe(feeds)[0]
    assert np.abs(got - want).max() < 2e-2 * np.abs(want).max()


def test_policy_rounds_the_core_of_blocks_and_of_attention_ops():
    g = models.bert_encoder(1, 64, 4, batch=2, seq=8)
    fused, _ = bz.fuse(g, "cpu")
    policy_graph, _ = apply_precision(fused, "bf16")
    block = next(n.op for n in policy_graph.nodes if n.op.kind == "fused_attention_block")
    assert block.round_core == bz.bf16 and block.attention_op.round_operands == bz.bf16
    plain, _ = apply_precision(g, "bf16")
    ops = [n.op for n in plain.nodes if n.op.kind == "attention"]
    assert ops and all(op.round_operands == bz.bf16 for op in ops)
    f16_graph, _ = apply_precision(fused, "f16")  # no f16 attention kernel: core stays f32
    assert all(getattr(n.op, "round_core", None) is None for n in f16_graph.nodes)
    keep = PrecisionPolicy("bf16-core-f32", attention_core=False)
    kept, _ = apply_precision(fused, keep)
    assert all(getattr(n.op, "round_core", None) is None for n in kept.nodes)
    params, feeds = bz.init_params(g, 0), bz.random_feeds(g, 2)
    want = bz.interpret(policy_graph, feeds, params)[0]
    unfused = bz.unfuse_fused_for_autodiff(policy_graph)
    np.testing.assert_allclose(bz.interpret(unfused, feeds, params)[0], want, rtol=1e-5,
                               atol=1e-5)
    core_f32 = bz.interpret(kept, feeds, params)[0]
    assert np.abs(core_f32 - want).max() > 1e-5 * np.abs(want).max()


@needs_c
def test_compiled_block_runs_the_rounded_core():
    g = models.llama_tiny()
    params, feeds = bz.init_params(g, 0), bz.random_feeds(g, 0)
    fused, _ = bz.fuse(g, "cpu")
    policy_graph, _ = apply_precision(fused, "bf16")
    exe = bz.compile(g, params=params, precision="bf16")
    rows = [i for _, k, _, i in exe.dispatch_report(feeds).rows
            if k == "fused_attention_block"]
    assert rows and all("bf16" in i for i in rows)
    want = bz.interpret(policy_graph, feeds, params)[0]
    got = exe(feeds)[0]
    assert np.abs(got - want).max() < 4e-3 * np.abs(want).max()


def test_fusion_keeps_the_rounding():
    """A block fused from a rounded attention op carries it as round_core."""
    block_graph = models.bert_encoder(1, 32, 2, batch=1, seq=4)
    plain, _ = apply_precision(block_graph, PrecisionPolicy("core-only", ops=()))
    assert [n.op.round_operands for n in plain.nodes if n.op.kind == "attention"] == [bz.bf16]
    fused, _ = bz.fuse(plain, "cpu")
    blocks = [n.op for n in fused.nodes if n.op.kind == "fused_attention_block"]
    assert blocks and all(b.round_core == bz.bf16 for b in blocks)
    params, feeds = bz.init_params(block_graph, 0), bz.random_feeds(block_graph, 0)
    np.testing.assert_allclose(bz.interpret(fused, feeds, params)[0],
                               bz.interpret(plain, feeds, params)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not attention_dp.available(), reason="no AVX512-BF16 here")
@pytest.mark.parametrize("shape, causal", [((2, 4, 2, 37, 53, 40, 40), True),
                                           ((1, 3, 3, 5, 7, 13, 13), False),
                                           ((1, 2, 1, 150, 300, 64, 64), True),
                                           ((2, 2, 2, 20, 20, 96, 24), False)],
                         ids=["gqa-causal-d40", "tiny-d13", "two-chunks", "dv-differs"])
@pytest.mark.parametrize("in16, out16", [(False, False), (True, False), (False, True),
                                         (True, True)])
def test_avx512_bf16_core_takes_and_gives_bf16(shape, causal, in16, out16):
    """attention_dp's core on q, k, v handed over as bf16 values gives what it gives on their
    f32 values, and its bf16 output is its f32 output rounded; it matches the f32
    micro-kernels on the rounded values up to the order of the f32 sums."""
    b, hq, hkv, sq, sk, d, dv = shape
    rng = np.random.default_rng(sum(shape))
    q, k = (_bf(rng.standard_normal((b, h, s, d), dtype=np.float32))
            for h, s in ((hq, sq), (hkv, sk)))
    v = _bf(rng.standard_normal((b, hkv, sk, dv), dtype=np.float32))

    def run(plan, q, k, v, out):
        st = tuple(s // arr.itemsize for arr in (q, k, v, out) for s in arr.strides[:3])
        scratch = np.empty(plan.scratch_shape, np.float32)
        attention_native.attn_heads(plan, q, k, v, out, st, 1 / np.sqrt(d), 0.0, causal, 0,
                                    None, (0, 0, 0, 0), scratch)
        return out

    f32 = run(attention_dp.DpHeadsPlan(shape), q, k, v, np.zeros((b, hq, sq, dv), np.float32))
    as16 = (lambda a: a.astype(ml_dtypes.bfloat16)) if in16 else (lambda a: a)
    out = np.zeros((b, hq, sq, dv), ml_dtypes.bfloat16 if out16 else np.float32)
    got = run(attention_dp.DpHeadsPlan(shape, in16, out16), as16(q), as16(k), as16(v), out)
    want = f32.astype(ml_dtypes.bfloat16) if out16 else f32
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    ref = run(attention_native.HeadsPlan(shape, True), q, k, v,
              np.zeros((b, hq, sq, dv), np.float32))
    assert np.abs(f32 - ref).max() < 4e-3 * np.abs(ref).max()
