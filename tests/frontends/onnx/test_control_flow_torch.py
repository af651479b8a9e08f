"""Real torch exports with control flow through bz.import_onnx, against ONNX Runtime at several
input sizes, interpreted and compiled: torch.jit.script-ed shape / data branches and loops
(TorchScript exporter: If, Loop), torch.cond, while_loop and scan (dynamo exporter: If, Loop,
Scan)."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import braze as bz  # noqa: E402


class ShapeBranch(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] > 4:
            return torch.tanh(x) * 2
        return x - 1


class DataBranch(torch.nn.Module):
    def forward(self, x):
        if bool(x.sum() > 0):
            y = x * 2
        else:
            y = -x
        return y


class RowLoop(torch.nn.Module):
    def forward(self, x):
        acc = torch.zeros_like(x[0])
        for i in range(x.shape[0]):
            acc = acc * 0.5 + x[i]
        return acc


class CondModule(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: torch.tanh(t) * 2, lambda t: t - 1, (x,))


class WhileModule(torch.nn.Module):
    def forward(self, x):
        from torch._higher_order_ops.while_loop import while_loop

        def cond(i, acc):
            return (i < 6) & (acc.sum() < 50)

        def body(i, acc):
            return i + 1, acc * 1.5 + 1

        return while_loop(cond, body, (torch.zeros((), dtype=torch.int64), x))


class ScanModule(torch.nn.Module):
    def forward(self, x):
        from torch._higher_order_ops.scan import scan

        def step(c, xt):
            n = c * 0.5 + xt
            return n, n * 2

        return scan(step, torch.zeros_like(x[0]), x)


def script_export(module) -> bytes:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.jit.script(module), (torch.randn(3, 6),), f, dynamo=False,
                          input_names=["x"], dynamic_axes={"x": {0: "n", 1: "d"}})
    return f.getvalue()


def dynamo_export(module, dynamic=True) -> bytes:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shapes = {"x": {0: torch.export.Dim("n")}} if dynamic else None
        prog = torch.onnx.export(module, (torch.randn(3, 6),), dynamo=True, input_names=["x"],
                                 dynamic_shapes=shapes, verbose=False)
    return prog.model_proto.SerializeToString()


def assert_matches_ort(data: bytes, g, sizes, scale=1.0):
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    exe = bz.compile(g, target="cpu")
    rng = np.random.default_rng(0)
    for shape in sizes:
        for sign in (1.0, -1.0):
            x = (np.abs(rng.standard_normal(shape)) * sign * scale).astype(np.float32)
            want = sess.run(None, {"x": x})
            for got in (bz.interpret(g, {"x": x}), exe({"x": x})):
                for a, b in zip(got, want):
                    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def kinds(g):
    return {n.op.kind for n in g.nodes}


def test_scripted_shape_branch_stays_a_cond_over_a_symbolic_dim_and_folds_when_static():
    data = script_export(ShapeBranch())
    assert "If" in [n.op_type for n in onnx.load_from_string(data).graph.node]
    g = bz.import_onnx(data)
    assert "if" in kinds(g)  # d > 4 is undecidable for a symbolic d: no guess
    assert_matches_ort(data, g, [(3, 6), (2, 3)])
    fixed = bz.import_onnx(data, input_shapes={"x": ("n", 6)})
    assert "if" not in kinds(fixed)  # 6 > 4 folds: only the then branch is imported
    assert any("then_branch (condition True at import)" in (n.provenance or "")
               for n in fixed.nodes)
    assert_matches_ort(data, fixed, [(3, 6), (5, 6)])


def test_scripted_data_branch_is_a_cond():
    data = script_export(DataBranch())
    g = bz.import_onnx(data)
    assert "if" in kinds(g)
    assert_matches_ort(data, g, [(3, 6), (4, 2)])


def test_scripted_loop_over_a_symbolic_length_is_a_while_and_a_scan_when_static():
    data = script_export(RowLoop())
    assert "Loop" in [n.op_type for n in onnx.load_from_string(data).graph.node]
    g = bz.import_onnx(data)
    assert "while" in kinds(g)
    assert_matches_ort(data, g, [(3, 6), (5, 2)])
    fixed = bz.import_onnx(data, input_shapes={"x": (4, 6)})
    assert "scan" in kinds(fixed) and "while" not in kinds(fixed)
    assert_matches_ort(data, fixed, [(4, 6)])


def test_dynamo_torch_cond_is_a_cond():
    data = dynamo_export(CondModule())
    g = bz.import_onnx(data)
    assert "if" in kinds(g)
    assert_matches_ort(data, g, [(3, 6), (5, 6)])


def test_dynamo_while_loop_is_a_while_and_exports_back_as_a_loop(tmp_path):
    data = dynamo_export(WhileModule(), dynamic=False)
    assert "Loop" in [n.op_type for n in onnx.load_from_string(data).graph.node]
    g = bz.import_onnx(data)
    assert "while" in kinds(g)
    assert_matches_ort(data, g, [(3, 6)], scale=3.0)
    path = bz.export_onnx(g, tmp_path / "while.onnx", target="standard")
    assert_matches_ort(open(path, "rb").read(), g, [(3, 6)], scale=3.0)


def test_dynamo_scan_is_a_scan():
    data = dynamo_export(ScanModule(), dynamic=False)
    assert "Scan" in [n.op_type for n in onnx.load_from_string(data).graph.node]
    g = bz.import_onnx(data)
    assert "scan" in kinds(g)
    assert_matches_ort(data, g, [(3, 6)])
