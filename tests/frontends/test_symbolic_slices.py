"""Slices whose start depends on a symbolic dim (ALiBi / position tables cut as
`table[..., -seq:]`, MPT's `max(0, 64 - seq)` clamp) and flips of a symbolic axis, through the
ONNX importer (TorchScript and dynamo exports) and import_torch, interpreted and compiled at
several sequence lengths; a binding that would need the clamp raises a braze ShapeError."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.errors import BrazeError, FrontendError
from braze.ir.ops.indexing import DynamicNarrow

torch = pytest.importorskip("torch")

TABLE = 16


class Tail(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(1, TABLE))

    def forward(self, x):                      # x [B, S]
        return x + self.table[:, -x.shape[1]:]


class ClampedTail(torch.nn.Module):          # MPT's form: an explicit max(0, size - seq)
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(3, TABLE))

    def forward(self, x):                      # x [B, 3, S]
        start = max(0, self.table.size(1) - x.shape[2])
        return x * self.table[:, start:]


class Flip(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x.flip(1), 1).flip(1)


def _import(module, x, how, tmp_path):
    axes = {0: "b", x.dim() - 1: "s"}
    if how == "torch":
        return bz.import_torch(module, (x,), dynamic_shapes={"x": axes})
    path = str(tmp_path / f"{type(module).__name__}_{how}.onnx")
    if how == "dynamo":
        dims = {k: torch.export.Dim(v, max=TABLE) for k, v in axes.items()}
        torch.onnx.export(module, (x,), path, input_names=["x"], dynamo=True,
                          dynamic_shapes={"x": dims}, verbose=False)
    else:
        torch.onnx.export(module, (x,), path, input_names=["x"], dynamo=False,
                          dynamic_axes={"x": axes}, opset_version=17)
    return bz.import_onnx(path)


def _feed(module, b, s):
    shape = (b, 3, s) if isinstance(module, ClampedTail) else (b, s)
    return np.random.default_rng(s).normal(size=shape).astype(np.float32)


HOWS = ["ts", "dynamo", "torch"]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("cls", [Tail, ClampedTail, Flip])
def test_symbolic_start_slices_match_torch_at_every_length(cls, how, tmp_path):
    torch.manual_seed(0)
    m = cls().eval()
    g = _import(m, torch.from_numpy(_feed(m, 2, 6)), how, tmp_path)
    kinds = {n.op.kind for n in g.nodes}
    if cls is not Flip:
        assert "dynamic_narrow" in kinds and "gather" not in kinds, kinds
    exe = bz.compile(g, "cpu")
    for b, s in ((2, TABLE), (1, 2), (3, 9)):
        x = _feed(m, b, s)
        want = m(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(bz.interpret(g, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(exe({"x": x})[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("how", HOWS)
def test_a_sequence_longer_than_the_table_raises_a_braze_error(how, tmp_path):
    m = Tail().eval()
    g = _import(m, torch.randn(2, 6), how, tmp_path)
    x = np.zeros((2, TABLE + 1), np.float32)
    if how == "torch":  # torch.export's range constraint (s <= TABLE) is the input's bound
        for run in (lambda: bz.interpret(g, {"x": x}), lambda: bz.compile(g, "cpu")({"x": x})):
            with pytest.raises(BrazeError, match=f"s = {TABLE + 1}, a size the graph does not "
                                                 f"hold for \\(s >= {TABLE + 1}\\): torch.export"):
                run()
        return
    with pytest.raises(BrazeError, match="breaks that assumption"):
        bz.interpret(g, {"x": x})
    with pytest.raises(BrazeError, match=f"outside axis 1 of size {TABLE}"):
        bz.compile(g, "cpu")({"x": x})


def test_dynamic_narrow_op_infers_checks_and_round_trips():
    g = bz.Graph("alibi_tail")
    x = g.input("x", bz.Shape(("b", "s")))
    t = g.param("t", bz.Shape((1, 8)))
    y = g.add(x, g.narrow(t, 1, "8-s", "s"))
    g.set_outputs([y])
    (node,) = [n for n in g.nodes if isinstance(n.op, DynamicNarrow)]
    assert node.op.start == "-s+8" and g.shape_of(y).dims == ("b", "s")
    assert str(bz.Graph.parse(str(g))) == str(g)
    tv = np.arange(8, dtype=np.float32)[None]
    out = bz.interpret(g, {"x": np.zeros((2, 3), np.float32)}, {"t": tv})[0]
    np.testing.assert_array_equal(out, np.broadcast_to(tv[:, 5:], (2, 3)))
    with pytest.raises(bz.ShapeError):
        g2 = bz.Graph("bad")
        g2.narrow(g2.param("t", bz.Shape((1, 8))), 1, "9-s", "s+1")  # ends past 8 always


def test_a_clamp_that_feeds_no_checked_slice_is_refused():
    class ClampedLength(torch.nn.Module):
        def forward(self, x):
            n = max(0, 16 - x.shape[1])
            return torch.ones(n) * x.sum()

    with pytest.raises(FrontendError, match="clamps sizes"):
        bz.import_torch(ClampedLength().eval(), (torch.randn(2, 6),),
                        dynamic_shapes={"x": {0: "b", 1: "s"}})


def test_a_strided_slice_of_an_odd_symbolic_span_is_refused_with_a_reason(tmp_path):
    class Every2nd(torch.nn.Module):
        def forward(self, x):
            return x[:, ::2]

    with pytest.raises(FrontendError, match="not a polynomial"):
        _import(Every2nd().eval(), torch.randn(2, 6), "ts", tmp_path)


@pytest.mark.parametrize("how", HOWS)
def test_tiny_mpt_imports_and_matches_torch_at_two_lengths(how, tmp_path):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.MptConfig(n_layers=2, d_model=64, n_heads=4, vocab_size=128, max_seq_len=64)

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = tf.MptModel(cfg).eval()

        def forward(self, x):
            return self.m(input_ids=x, use_cache=False).last_hidden_state

    m = LastHidden().eval()
    ids = torch.randint(0, 128, (2, 8))
    if how == "torch":
        g = bz.import_torch(m, (ids,), dynamic_shapes={"x": {0: "batch", 1: "seq"}})
    else:
        path = str(tmp_path / f"mpt_{how}.onnx")
        if how == "dynamo":
            dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", max=64)}
            torch.onnx.export(m, (ids,), path, input_names=["x"], dynamo=True,
                              dynamic_shapes={"x": dims}, verbose=False)
        else:
            torch.onnx.export(m, (ids,), path, input_names=["x"], dynamo=False,
                              dynamic_axes={"x": {0: "batch", 1: "seq"}}, opset_version=17)
        g = bz.import_onnx(path)
    assert any(isinstance(n.op, DynamicNarrow) for n in g.nodes)
    exe = bz.compile(g, "cpu")
    for b, s in ((2, 64), (1, 5)):
        x = np.random.default_rng(s).integers(0, 128, (b, s)).astype(np.int64)
        with torch.no_grad():
            want = m(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(bz.interpret(g, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(exe({"x": x})[0], want, rtol=1e-4, atol=1e-4)
    with pytest.raises(BrazeError, match="breaks that assumption"):
        exe({"x": np.zeros((1, 65), np.int64)})


class LastKeys(torch.nn.Module):               # a sliding-window cache keeping its last 4 keys
    def forward(self, k):                      # k [B, past, D]
        return k[:, -4:] * 2


def test_a_tail_slice_torch_clamped_at_the_example_is_refused():
    """With an example shorter than the slice (past 3 < 4) torch records the length `past`
    (start clamped to 0): the import had built narrow(past-4, past), which fails at every past
    but 4; it is now refused with the way out. A long enough example imports, runs past >= 4
    and refuses a shorter cache (torch's range constraint past >= 4)."""
    with pytest.raises(FrontendError, match=r"slice_1?.*from past-4 keeps past elements: torch "
                                            r"clamped.*export with an example at least as long"):
        bz.import_torch(LastKeys().eval(), (torch.randn(2, 3, 8),),
                        dynamic_shapes={"k": {1: "past"}})
    g = bz.import_torch(LastKeys().eval(), (torch.randn(2, 6, 8),),
                        dynamic_shapes={"k": {1: "past"}})
    exe = bz.compile(g, "cpu")
    for past in (4, 9):
        k = np.random.default_rng(past).standard_normal((2, past, 8)).astype(np.float32)
        np.testing.assert_allclose(exe({"k": k})[0], k[:, -4:] * 2, rtol=1e-6)
    with pytest.raises(BrazeError, match=r"past = 3, a size the graph does not hold for \(past "
                                         r"in 0..3\): torch.export made the program for past in 4"):
        exe({"k": np.zeros((2, 3, 8), np.float32)})  # its range constraint, the input's bound
