"""Batched bf16 matmuls (kernels/bf16_batched.py): under the bf16 policy a matmul of two rank
>= 3 operands, each the policy's rounding of an activation or a static bf16-valued tensor,
runs MKL's bf16 GEMM per matrix with the batch over the threads, reading the operands before
the policy's rounding. Checked against the reference interpreter on the policy's graph."""
import numpy as np
import pytest

import braze as bz
from braze.runtime.kernels import bf16_batched

needs_it = pytest.mark.skipif(bf16_batched._gemm_address() is None or bf16_batched._lib() is None,
                              reason="no MKL bf16 GEMM on a bf16 CPU, or no C compiler here")
NAME = "batched bf16 matmul"


@pytest.fixture(autouse=True)
def _forced(monkeypatch):
    """The kernel itself is under test: on, whatever this machine measured (see below)."""
    monkeypatch.setenv("BRAZE_BF16_BATCHED", "1")


def _close(got, want):
    """Within 4e-3 of the output's scale: f32 sums in another order than NumPy's."""
    scale = max(1.0, float(np.abs(want).max()))
    assert np.abs(got - want).max() < 4e-3 * scale


def _graph(a_shape, b_shape, *, transpose_b=False, static_b=False, slice_a=False):
    g = bz.Graph("batched")
    x = g.input("x", bz.Shape(a_shape[:-1] + (a_shape[-1] * (2 if slice_a else 1),)))
    if slice_a:
        x = g.narrow(x, len(a_shape) - 1, 0, a_shape[-1])
    stored = b_shape[:-2] + (b_shape[-1], b_shape[-2]) if transpose_b else b_shape
    y = g.param("y", bz.Shape(stored)) if static_b else g.input("y", bz.Shape(stored))
    if transpose_b:
        perm = tuple(range(len(b_shape) - 2)) + (len(b_shape) - 1, len(b_shape) - 2)
        y = g.transpose(y, perm)
    h = g.tanh(x)  # an activation: the rounding reads a computed value
    g.set_outputs([g.add(g.matmul(h, y), 1.0)])
    return g


def _matmul_row(exe, feeds):
    return [r for r in exe.dispatch_report(feeds).rows
            if r[1] in ("matmul", "fused_matmul_bias_act")]


@needs_it
@pytest.mark.parametrize("a_shape, b_shape, kw", [
    ((12, 33, 17), (12, 17, 40), {}),                        # the batch over the threads
    ((2, 3, 9, 16), (2, 3, 16, 7), {}),                      # leading dims collapsed
    ((12, 33, 17), (12, 17, 40), {"transpose_b": True}),     # b read transposed (k @ q^T)
    ((5, 21, 8), (5, 8, 19), {"slice_a": True}),             # a's rows wider than k
    ((1, 30, 20), (1, 20, 10), {}),                          # one matrix
    ((12, 16, 64), (12, 64, 96), {"static_b": True}),        # b static: bf16 once, at build
])
def test_batched_activation_matmul_runs_bf16(a_shape, b_shape, kw):
    g = _graph(a_shape, b_shape, **kw)
    params = bz.init_params(g, seed=3) if kw.get("static_b") else None
    exe = bz.compile(g, params=params, precision="bf16", threads=2)
    for seed in (1, 2):
        feeds = bz.random_feeds(g, seed)
        (got,), (want,) = exe(feeds), bz.interpret(exe.graph, feeds, params or {})
        _close(got, want)
        (f32,) = bz.interpret(g, feeds, params or {})
        assert np.abs(got - f32).max() < 3e-2 * max(1.0, float(np.abs(f32).max()))
    rows = _matmul_row(exe, feeds)
    assert len(rows) == 1 and NAME in rows[0][3], rows
    casts = [r for r in exe.dispatch_report(feeds).rows if r[1] == "cast"]
    assert all(r[3].startswith("done inside") or r[2] == "static" for r in casts), casts


@needs_it
def test_f32_precision_keeps_the_f32_batched_gemm():
    g = _graph((12, 33, 17), (12, 17, 40))
    exe = bz.compile(g, threads=2)
    feeds = bz.random_feeds(g, 0)
    rows = _matmul_row(exe, feeds)
    assert len(rows) == 1 and NAME not in rows[0][3]
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds)[0], rtol=1e-5, atol=1e-5)


@needs_it
def test_broadcast_leading_dims_are_left_to_the_f32_gemm():
    """a [4, M, K] @ b [K, N]: b is no batch of matrices (the bf16 weight GEMM's case when b is
    static, the f32 GEMM on rounded operands when it is an activation)."""
    g = bz.Graph("bcast")
    x, y = g.input("x", bz.Shape((4, 9, 16))), g.input("y", bz.Shape((16, 5)))
    g.set_outputs([g.matmul(g.tanh(x), g.tanh(y))])
    exe = bz.compile(g, precision="bf16", threads=2)
    feeds = bz.random_feeds(g, 4)
    assert NAME not in _matmul_row(exe, feeds)[0][3]
    _close(exe(feeds)[0], bz.interpret(exe.graph, feeds)[0])


@needs_it
def test_dynamic_batch_is_planned_per_binding():
    g = bz.Graph("dyn")
    x = g.input("x", bz.Shape(("b", 7, 12)))
    y = g.input("y", bz.Shape(("b", 12, 9)))
    g.set_outputs([g.matmul(g.tanh(x), y)])
    exe = bz.compile(g, precision="bf16", threads=2)
    for b in (1, 3, 8):
        rng = np.random.default_rng(b)
        feeds = {"x": rng.standard_normal((b, 7, 12), dtype=np.float32),
                 "y": rng.standard_normal((b, 12, 9), dtype=np.float32)}
        _close(exe(feeds)[0], bz.interpret(exe.graph, feeds)[0])
    assert NAME in _matmul_row(exe, feeds)[0][3]


@needs_it
def test_the_choice_is_measured_once_and_followed(monkeypatch):
    from braze.runtime.kernels import gemm_choice

    monkeypatch.delenv("BRAZE_BF16_BATCHED")
    g = _graph((6, 20, 24), (6, 24, 12))
    feeds = bz.random_feeds(g, 5)
    exe = bz.compile(g, precision="bf16", threads=2)
    got = exe(feeds)[0]
    choice = gemm_choice._load()["bmm-bf16:6x20x24x12:2"]
    assert choice in gemm_choice.BATCHED_CHOICES
    assert (NAME in _matmul_row(exe, feeds)[0][3]) == (choice == "bf16_batched")
    _close(got, bz.interpret(exe.graph, feeds)[0])
    monkeypatch.setenv("BRAZE_BF16_BATCHED", "0")
    off = bz.compile(g, precision="bf16", threads=2)
    assert NAME not in _matmul_row(off, feeds)[0][3]
    _close(off(feeds)[0], bz.interpret(off.graph, feeds)[0])
