"""compute_half_in_f32: a float16 / bfloat16 model's matmuls, attention, norms and softmax run
on float32 kernels (inputs cast up, results cast back), so `bz.compile` runs a half-precision
model natively instead of on NumPy references; results stay within about an ulp of the
model's dtype of the reference interpreter."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.passes.half_compute import compute_half_in_f32
from braze.runtime.kernels import Dispatch


def _block(dtype) -> bz.Graph:
    """A small transformer block, every value in `dtype`."""
    g = bz.Graph("block")
    x = g.input("x", bz.Shape(("batch", 16, 32), dtype))
    p = {name: g.param(name, bz.Shape(shape, dtype)) for name, shape in [
        ("wq", (32, 32)), ("wk", (32, 32)), ("wv", (32, 32)), ("w1", (32, 64)), ("b1", (64,)),
        ("w2", (64, 32)), ("gamma", (32,)), ("beta", (32,))]}
    q, k, v = (g.matmul(x, p[w]) for w in ("wq", "wk", "wv"))
    a = g.attention(q, k, v, num_heads=4, kind="causal")
    h = g.layer_norm(g.add(x, a), p["gamma"], p["beta"])
    y = g.matmul(g.gelu(g.add(g.matmul(h, p["w1"]), p["b1"])), p["w2"])
    g.set_outputs([g.add(h, y), g.softmax(y, -1)])
    return g


def _params(g: bz.Graph, dtype) -> dict:
    return {k: (v * 0.3).astype(dtype) for k, v in bz.init_params(g, 0).items()}


def _feeds(dtype, batch=2, seed=0) -> dict:
    x = np.random.default_rng(seed).standard_normal((batch, 16, 32))
    return {"x": x.astype(dtype)}


@pytest.mark.parametrize("dtype", [bz.bf16, bz.f16])
def test_a_half_model_compiles_to_native_kernels_and_matches_the_reference(dtype):
    g = _block(dtype)
    params = _params(g, dtype.np)
    exe = bz.compile(g, params=params)
    report = exe.dispatch_report(_feeds(dtype.np))
    assert not report.by_dispatch(Dispatch.REFERENCE), str(report)
    ulp = 2.0 ** -7 if dtype == bz.bf16 else 2.0 ** -10
    for batch, seed in ((2, 0), (3, 1)):
        feeds = _feeds(dtype.np, batch, seed)
        got = exe(feeds)
        want = bz.interpret(g, feeds, params)
        for a, w in zip(got, want, strict=True):
            assert a.dtype == w.dtype == dtype.np
            a32, w32 = a.astype(np.float32), w.astype(np.float32)
            scale = float(np.abs(w32).max())
            assert float(np.abs(a32 - w32).max()) <= 4 * ulp * scale


@pytest.mark.parametrize("dtype", [bz.bf16, bz.f16])
def test_the_pass_casts_around_each_heavy_op_and_keeps_the_model_dtype(dtype):
    g = _block(dtype)
    fused, _ = bz.fuse(g, "cpu")
    before = fused.op_counts()
    out, moved = compute_half_in_f32(fused)
    heavy = sum(n for kind, n in before.items() if kind in (
        "matmul", "fused_matmul_bias_act", "attention", "fused_attention_block", "layer_norm",
        "fused_residual_ln", "softmax"))
    assert moved == heavy > 0
    assert fused.op_counts() == before  # the input graph is untouched
    for n in out.nodes:
        if n.op.kind in ("fused_attention_block", "fused_matmul_bias_act", "softmax",
                         "fused_residual_ln", "layer_norm", "attention", "matmul"):
            assert all(out.shape_of(v).dtype == bz.f32 for v in n.inputs
                       if out.shape_of(v).dtype.is_float)
            assert all(s.dtype == bz.f32 for s in n.outputs)
    assert [out.shape_of(v).dtype for v in out.outputs] == [dtype, dtype]
    # the weights' casts read params only: weight preparation, computed once
    exe = bz.compile(g, params=_params(g, dtype.np))
    exe(_feeds(dtype.np))
    static = [r for r in exe.dispatch_report().rows if r[1] == "cast" and r[2] == Dispatch.STATIC]
    assert len(static) >= 6


def test_float32_and_mixed_nodes_are_left_alone():
    g = _block(bz.f32)
    assert compute_half_in_f32(g) == (g, 0)
    mixed = bz.Graph("mixed")
    x = mixed.input("x", bz.Shape((4, 8), bz.bf16))
    w = mixed.input("w", bz.Shape((8, 8), bz.f32))
    mixed.set_outputs([mixed.matmul(mixed.cast(x, bz.f32), w), mixed.softmax(x, -1)])
    out, moved = compute_half_in_f32(mixed)
    assert moved == 1  # the bf16 softmax; the f32 matmul stays as it is
    assert out.count("cast") == mixed.count("cast") + 2


def test_a_bfloat16_torch_model_runs_natively_and_matches_pytorch():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=300)
    torch.manual_seed(0)
    bert = transformers.BertModel(cfg).eval().to(torch.bfloat16)

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids):
            return self.bert(input_ids=ids).last_hidden_state

    ids = torch.randint(0, 300, (2, 24))
    g = bz.import_torch(Hidden().eval(), (ids,))
    exe = bz.compile(g)
    (got,) = exe({g.inputs[0].op.name: ids.numpy()})
    assert not exe.dispatch_report().by_dispatch(Dispatch.REFERENCE)
    with torch.no_grad():
        want = Hidden()(ids).float().numpy()
    # bf16 end to end: each layer rounds to 8 bits; PyTorch's own kernels round differently
    assert float(np.abs(got.astype(np.float32) - want).max()) < 0.05 * np.abs(want).max()


@pytest.mark.parametrize("dtype", [bz.bf16, bz.f16])
def test_half_reductions_run_natively_and_match_the_reference(dtype):
    """NumPy sums float16 pairwise in float32 and rounds once; a reduction moved to float32
    does the same (max / min are exact either way)."""
    g = bz.Graph("r")
    x = g.input("x", bz.Shape((64, 3000), dtype))
    g.set_outputs([g.sum(x, (1,)), g.mean(x, (0,)), g.reduce_max(x, (1,))])
    exe = bz.compile(g)
    feeds = bz.random_feeds(g, 0)
    ulp = 2.0 ** -7 if dtype == bz.bf16 else 2.0 ** -10
    for got, want in zip(exe(feeds), bz.interpret(g, feeds), strict=True):
        assert got.dtype == want.dtype == dtype.np
        w = want.astype(np.float32)
        assert float(np.abs(got.astype(np.float32) - w).max()) <= ulp * np.abs(w).max()
    assert not exe.dispatch_report().by_dispatch(Dispatch.REFERENCE)
