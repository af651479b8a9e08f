"""Slice assignment through both importers: ONNX ScatterND on values known at import time
(index tables written by `t[1:, 1:] = v`, BEiT's relative position index) folds to a constant,
and one reading a run-time value is computed at run time; torch's slice_scatter /
copy (what `y[:, 1:3] = v` and `z.copy_(y)` export to) become concats of the
untouched parts around the source and reproduce PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _scatter_model(data_is_input: bool):
    table = np.arange(12, dtype=np.int64).reshape(3, 4)
    idx = np.array([[2], [0]], np.int64)
    upd = np.array([[7, 7, 7, 7], [9, 8, 7, 6]], np.int64)
    inits = [numpy_helper.from_array(idx, "idx"), numpy_helper.from_array(upd, "upd")]
    inputs = [helper.make_tensor_value_info("x", F, [3, 4])]
    if data_is_input:
        inputs.append(helper.make_tensor_value_info("table", I64, [3, 4]))
    else:
        inits.append(numpy_helper.from_array(table, "table"))
    nodes = [helper.make_node("ScatterND", ["table", "idx", "upd"], ["t"], name="write_rows"),
             helper.make_node("Cast", ["t"], ["tf"], to=F),
             helper.make_node("Add", ["x", "tf"], ["y"], name="use")]
    graph = helper.make_graph(nodes, "scatter", inputs,
                              [helper.make_tensor_value_info("y", F, [3, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want_table = table.copy()
    want_table[2], want_table[0] = upd[0], upd[1]
    return model, want_table


def test_scatter_nd_of_import_time_values_folds_to_a_constant():
    model, table = _scatter_model(data_is_input=False)
    g = bz.import_onnx(model)
    assert g.count("scatter_nd") == 0 and not any("Scatter" in n.op.kind for n in g.nodes)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    (got,) = bz.interpret(g, {"x": x})
    np.testing.assert_allclose(got, x + table, rtol=1e-6)


def test_scatter_nd_of_a_run_time_value_writes_the_rows_at_run_time():
    model, want_table = _scatter_model(data_is_input=True)
    g = bz.import_onnx(model)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    table = np.arange(12, dtype=np.int64).reshape(3, 4)
    for got in (bz.interpret(g, {"x": x, "table": table}),
                bz.compile(g, "cpu")({"x": x, "table": table})):
        np.testing.assert_allclose(got[0], x + want_table, rtol=1e-6)


torch = pytest.importorskip("torch")


class _Assign(torch.nn.Module):
    """Slice, row and whole-tensor assignment into a clone of the input."""

    def forward(self, x, v):
        y = x.clone()
        y[:, 1:3] = v                  # slice_scatter along dim 1
        y[0] = y[0] * 2.0              # a row write (torch decomposes it to a where)
        z = torch.zeros_like(x)
        z.copy_(y[:1])                 # copy with a broadcast source
        return y + z


def test_torch_slice_assignment_reproduces_pytorch():
    m = _Assign().eval()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    v = rng.standard_normal((3, 2)).astype(np.float32)
    g = bz.import_torch(m, (torch.from_numpy(x), torch.from_numpy(v)))
    assert g.count("concat") == 1  # the slice assignment; the row write decomposes to a where
    x2 = rng.standard_normal((3, 5)).astype(np.float32)
    v2 = rng.standard_normal((3, 2)).astype(np.float32)
    with torch.no_grad():
        want = m(torch.from_numpy(x2), torch.from_numpy(v2)).numpy()
    (got,) = bz.interpret(g, dict(zip([i.op.name for i in g.inputs], (x2, v2))))
    np.testing.assert_allclose(got, want, rtol=1e-6)


class _Strided(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        y[:, ::2] = 0.0
        return y


def test_torch_strided_slice_assignment_is_refused_with_a_reason():
    with pytest.raises(bz.BrazeError, match=r"step other than 1"):
        bz.import_torch(_Strided().eval(), (torch.ones(2, 6),))
