"""Every op kind in the IR registry runs through `bz.compile` (a kernel, a decomposition or the
reference fallback, never an error) and gives the interpreter's outputs: fused and unfused, with
2 threads, twice in a row on fresh inputs (the arena is reused), and under the bf16 policy
(against the interpreter run of the same policy graph). Each kind's instance is its
braze.op_examples graph (input "x" f32[2, 3, 8])."""
import numpy as np
import pytest

import braze as bz
from braze.ir.op import OP_REGISTRY
from braze.op_examples import OP_EXAMPLES, example_graph
from braze.passes.forward_only import DROPPED_KINDS
from braze.runtime.kernels import Dispatch
from braze.testing import _compare

KINDS = sorted(OP_REGISTRY)
KNOWN = {Dispatch.NATIVE, Dispatch.GENERATED, Dispatch.REFERENCE, Dispatch.VIEW,
         Dispatch.STATIC}


def _outputs_match(want, got, seed, rtol, atol) -> None:
    assert len(want) == len(got)
    for i, (w, a) in enumerate(zip(want, got, strict=True)):
        w, a = np.asarray(w), np.asarray(a)
        scale = float(np.abs(w[np.isfinite(w)]).max(initial=1.0)) if w.dtype.kind == "f" else 1
        _compare(w, a, i, len(want), seed, rtol, atol * max(scale, 1.0))


def test_every_registered_kind_has_an_instance():
    assert not set(OP_REGISTRY) - set(OP_EXAMPLES)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_op_kind_compiles_and_matches_the_interpreter(kind, fuse):
    g = example_graph(kind)
    params = bz.init_params(g, 0)
    exe = bz.compile(g, "cpu", params=params, fuse=fuse, threads=2)
    for seed in (1, 2):
        feeds = bz.random_feeds(g, seed)
        want = bz.interpret(g, feeds, params)
        _outputs_match(want, exe(feeds), seed, 1e-4, 1e-5)
    report = exe.dispatch_report()
    assert {d for _, _, d, _ in report.rows} <= KNOWN
    if not fuse and kind not in DROPPED_KINDS:  # the kind reached the executor: it runs,
        # or was decomposed for lack of one (compile drops the DROPPED_KINDS: forward_only)
        assert any(n.op.kind == kind for n in exe.graph.nodes) or report.decomposed

@pytest.mark.parametrize("kind", KINDS)
def test_every_op_kind_compiles_under_the_bf16_policy(kind):
    g = example_graph(kind)
    params = bz.init_params(g, 0)
    exe = bz.compile(g, "cpu", params=params, precision="bf16")
    feeds = bz.random_feeds(g, 3)
    _outputs_match(bz.interpret(exe.graph, feeds, params), exe(feeds), 3, 1e-3, 1e-4)


@pytest.mark.parametrize("dtype", [bz.bf16, bz.f16])
def test_half_precision_contractions_keep_their_declared_dtype(dtype):
    """matmul of bfloat16 arrays came back float32 from the reference (NumPy promotes), so
    the interpreter disagreed with the declared type and the compiled executor; dot_general
    refused bfloat16 (einsum). Both accumulate in float32 and round to the input dtype."""
    g = bz.Graph("half")
    x, w = g.input("x", bz.Shape((3, 5), dtype)), g.input("w", bz.Shape((2, 5), dtype))
    g.set_outputs([g.matmul(x, g.transpose(w, (1, 0))), g.dot_general(x, w, (1,), (1,))])
    feeds = bz.random_feeds(g, 0)
    want = bz.interpret(g, feeds)
    assert all(a.dtype == dtype.np for a in want)
    exact = np.asarray(feeds["x"], np.float64) @ np.asarray(feeds["w"], np.float64).T
    for a in want:
        np.testing.assert_allclose(a.astype(np.float64), exact, rtol=1e-2, atol=1e-2)
    _outputs_match(want, bz.compile(g, "cpu")(feeds), 0, 1e-6, 1e-6)
