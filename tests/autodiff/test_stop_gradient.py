"""stop_gradient: the identity to the interpreter and the compiled executor (dropped, or read
as the identity by a region's generated code), a constant to autodiff (no cotangent, zero
tangent; checked against torch's `detach`), batched by vmap, held by element-wise regions,
exported to ONNX as Identity, printed and parsed."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz

X = np.array([[0.3, -1.2, 2.0], [0.7, 0.1, -0.4]], np.float64)


def _graph() -> bz.Graph:
    """loss = sum(x * stop_gradient(x)^2 + tanh(stop_gradient(2x) + x))."""
    g = bz.Graph("sg")
    x = g.input("x", bz.Shape((2, 3), bz.f64))
    s = g.stop_gradient(x)
    t = g.tanh(g.add(g.stop_gradient(g.mul(x, 2.0)), x))
    g.set_outputs([g.sum(g.add(g.mul(x, g.mul(s, s)), t))])
    return g


def test_gradient_matches_torch_detach():
    torch = pytest.importorskip("torch")
    loss, dx = bz.interpret(bz.grad_with_loss(_graph(), ["x"]), {"x": X})
    tx = torch.tensor(X, requires_grad=True)
    want = (tx * tx.detach() ** 2 + torch.tanh((2 * tx).detach() + tx)).sum()
    want.backward()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-12)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-12)


def test_forward_mode_gives_a_zero_tangent_and_second_order_stops_too():
    g = bz.Graph("only_stopped")
    x = g.input("x", bz.Shape((2, 3), bz.f64))
    g.set_outputs([g.sum(g.exp(g.stop_gradient(x)))])
    _, tangent = bz.interpret(bz.jvp(g, ["x"]), {"x": X, "tangent_x": np.ones_like(X)})
    assert tangent == 0.0
    (hv,) = bz.interpret(bz.hvp(_graph(), ["x"]), {"x": X, "tangent_x": np.ones_like(X)})
    d = np.tanh(3 * X)  # H of sum(x * c^2 + tanh(c' + x)) is diagonal: -2 tanh sech^2
    np.testing.assert_allclose(hv, -2 * d * (1 - d ** 2), rtol=1e-10)


def test_compiled_it_is_a_region_member_and_matches_the_interpreter():
    g = _graph()
    np.testing.assert_allclose(bz.compile(g)({"x": X})[0], bz.interpret(g, {"x": X})[0],
                               rtol=1e-12)
    fused, _ = bz.fuse(g, target="cpu")
    held = [n for n in fused.nodes if n.op.kind == "elementwise_region"
            and any(b.op.kind == "stop_gradient" for b in n.op.body.nodes)]
    assert held, "an element-wise region holds the stop_gradient"
    exe = bz.compile(fused)  # fused before compiling: the region's generated code holds it
    np.testing.assert_allclose(exe({"x": X})[0], bz.interpret(g, {"x": X})[0], rtol=1e-12)
    assert "reference" not in {row[2] for row in exe.dispatch_report().rows}
    gg = bz.grad_with_loss(fused, ["x"])  # differentiating the fused graph still stops
    np.testing.assert_allclose(bz.interpret(gg, {"x": X})[1],
                               bz.interpret(bz.grad_with_loss(g, ["x"]), {"x": X})[1],
                               rtol=1e-12)


def test_a_compiled_graph_drops_it():
    """An executable runs forward only: stop_gradient is the identity (passes.forward_only)."""
    g = bz.Graph("view")
    x, w = g.input("x", bz.Shape((2, 3))), g.input("w", bz.Shape((3, 2)))
    g.set_outputs([g.matmul(g.stop_gradient(x), w)])
    exe = bz.compile(g)
    xv, wv = X.astype(np.float32), np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_allclose(exe({"x": xv, "w": wv})[0], xv @ wv, rtol=1e-6)
    assert "stop_gradient" not in {row[1] for row in exe.dispatch_report().rows}


def test_vmap_text_ir_save_load_and_onnx_export(tmp_path):
    g = _graph()
    batched = bz.vmap(g)
    xs = np.stack([X, 2 * X])
    got = bz.interpret(batched, {"x": xs})[0]
    np.testing.assert_allclose(got, [bz.interpret(g, {"x": x})[0] for x in xs], rtol=1e-12)
    assert "stop_gradient(" in str(g)
    again = bz.Graph.parse(str(g))
    bz.save(g, tmp_path / "g.json")
    for h in (again, bz.load(tmp_path / "g.json")):
        assert [n.op.kind for n in h.nodes] == [n.op.kind for n in g.nodes]
        np.testing.assert_allclose(bz.interpret(bz.grad_with_loss(h, ["x"]), {"x": X})[1],
                                   bz.interpret(bz.grad_with_loss(g, ["x"]), {"x": X})[1])
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    bz.export_onnx(g, tmp_path / "g.onnx")
    model = onnx.load(tmp_path / "g.onnx")
    assert [n.op_type for n in model.graph.node].count("Identity") >= 2
    sess = ort.InferenceSession(str(tmp_path / "g.onnx"))
    (out,) = sess.run(None, {"x": X})
    np.testing.assert_allclose(out, bz.interpret(g, {"x": X})[0], rtol=1e-12)
