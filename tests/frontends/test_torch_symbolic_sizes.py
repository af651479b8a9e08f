"""import_torch with sizes computed from dynamic dims. An index clamped to `size - 1` (torch's
decompositions of replicate / reflect pad and linear interpolation, or a clamp the model writes)
imports as a run-time maximum / minimum and matches PyTorch at two bindings, interpreted and
compiled. A size braze cannot write as a polynomial (a pooling that rounds, roll on a dynamic
dim) is a FrontendError naming the node and the dim as the user named it, and saying how to
import it."""
from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


SEQ = ((2, 4, 8), {0: "batch", 2: "seq"}, [(2, 4, 8), (3, 4, 13)])
IMAGE = ((2, 3, 6, 7), {0: "batch", 2: "h", 3: "w"}, [(2, 3, 6, 7), (1, 3, 9, 5)])

CASES = {
    "pad_1d": (lambda x: (F.pad(x, (3, 0), mode="reflect"),
                          F.pad(x, (0, 2), mode="replicate")), SEQ),
    "pad_2d": (lambda x: (F.pad(x, (1, 2, 2, 1), mode="reflect"),
                          F.pad(x, (1, 2, 0, 3), mode="replicate")), IMAGE),
    "linear_interpolate": (lambda x: F.interpolate(x, scale_factor=3, mode="linear"), SEQ),
    "clamp_by_size": (lambda x: (x * 10).clamp(min=1 - x.shape[2], max=x.shape[2] - 1), SEQ),
    "clamp_min_max_by_size": (lambda x: (torch.clamp_min(x * 10, -x.shape[2]),
                                         torch.clamp_max(x * 10, x.shape[2])), SEQ),
    "clamp_index_by_size": (lambda x: torch.gather(
        x, 2, (x * 10).long().clamp(0, x.shape[2] - 1)), SEQ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_clamps_to_a_dynamic_size_match_torch_at_two_bindings(name):
    fn, (example, dynamic, bindings) = CASES[name]
    m = Fn(fn).eval()
    g = bz.import_torch(m, (torch.randn(*example),), dynamic_shapes={"x": dynamic})
    exe = bz.compile(g, target="cpu")
    for i, shape in enumerate(bindings):
        x = torch.from_numpy(np.random.default_rng(i).normal(size=shape).astype(np.float32))
        want = m(x)
        want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
        for how, got in (("interpret", bz.interpret(g, {"x": x.numpy()})),
                         ("compile", exe({"x": x.numpy()}))):
            assert len(got) == len(want)
            for a, b in zip(got, want):
                assert a.shape == b.shape, (how, shape)
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"{how} {shape}")


def _import_error(fn, spec) -> str:
    example, dynamic, _ = spec
    with pytest.raises(FrontendError) as info:
        bz.import_torch(Fn(fn).eval(), (torch.randn(*example),),
                        dynamic_shapes={"x": dynamic})
    return str(info.value)


@pytest.mark.parametrize("fn, expected", [
    (lambda x: F.avg_pool2d(x, 2, ceil_mode=True),
     r"node avg_pool2d \(aten\.avg_pool2d\.default\): the size \(h - 1\) // 2 rounds a "
     r"division down.*import with h static: leave that dim out of dynamic_shapes"),
    (lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
     r"node max_pool2d .*the size h // 2 rounds .*import with h static"),
    (lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear"),
     r"node upsample_bilinear2d .*the size trunc\(1\.5\*float\(h\)\) is not a polynomial.*"
     r"import with h static: leave that dim out"),
])
def test_sizes_braze_cannot_write_name_the_users_dims(fn, expected):
    message = _import_error(fn, IMAGE)
    assert re.search(expected, message), message
    assert not re.search(r"\bs\d+\b", message), message  # no torch symbols (s53)


def test_roll_of_a_dynamic_dim_names_the_dim():
    message = _import_error(lambda x: torch.roll(x, 3, 2), SEQ)
    assert re.search(r"node mod \(operator\.mod\): the size \(seq - 3\) % seq is not a "
                     r"polynomial.*import with seq static", message), message
    assert not re.search(r"\bs\d+\b", message), message


def test_a_float_computed_from_a_size_names_the_dim():
    message = _import_error(lambda x: F.interpolate(x, size=5, mode="linear"), SEQ)
    assert re.search(r"seq / 5 is a float computed from the input sizes.*import with seq "
                     r"static", message), message


class ClsTokenFlatten(torch.nn.Module):
    """A CLS token prepended ([B, S+1, D]), then flattened to B*T rows and restored: the
    reshape target batch*seq+batch is the input's batch x (seq+1) written expanded."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, 16))
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        z = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1)
        b, t, d = z.shape
        return self.lin(z.reshape(b * t, d)).reshape(b, t, d)


@pytest.mark.parametrize("how", ["torch", "onnx"])
def test_a_flatten_of_a_sum_of_dims_imports_and_matches_torch(how, tmp_path):
    net = ClsTokenFlatten().eval()
    dyn = {"x": {0: "batch", 1: "seq"}}
    if how == "torch":
        g = bz.import_torch(net, (torch.randn(2, 5, 16),), dynamic_shapes=dyn)
    else:
        path = tmp_path / "cls.onnx"
        torch.onnx.export(net, (torch.randn(2, 5, 16),), str(path), dynamo=False,
                          input_names=["x"], dynamic_axes=dyn, opset_version=17)
        g = bz.import_onnx(str(path))
    exe = bz.compile(g)
    for shape in ((2, 5, 16), (3, 9, 16)):
        x = torch.randn(*shape)
        with torch.no_grad():
            want = net(x).numpy()
        np.testing.assert_allclose(exe({"x": x.numpy()})[0], want, rtol=1e-5, atol=1e-5)


class _FirstColumns(torch.nn.Module):
    def forward(self, x):
        return x[:, :64] * 2


def test_sizes_outside_torch_exports_range_are_refused_and_sizes_0_and_1_still_run():
    """torch.export made the program for seq <= 64 (x[:, :64] exported as all of x); a longer
    feed had run silently, doubling every column where the module keeps 64. torch's usual
    minimum of 2 is no limit: braze runs sizes 0 and 1."""
    ep = torch.export.export(_FirstColumns(), (torch.randn(2, 10),),
                             dynamic_shapes={"x": {0: torch.export.Dim("b"),
                                                   1: torch.export.Dim("seq", max=64)}})
    g = bz.import_torch(ep)
    exe = bz.compile(g)
    for b, n in ((1, 1), (2, 64), (0, 3)):
        x = np.random.default_rng(n).standard_normal((b, n)).astype(np.float32)
        np.testing.assert_allclose(exe({"x": x})[0], x * 2, rtol=1e-6)
    for run in (lambda f: bz.interpret(g, f), exe):
        with pytest.raises(bz.BrazeError, match=r"binds x_dim1 = 65, a size the graph does not "
                                                r"hold for \(x_dim1 >= 65\): torch.export"):
            run({"x": np.ones((2, 65), np.float32)})


class _FirstRows(torch.nn.Module):
    def forward(self, a):
        return a[:64] * 2


def test_a_derived_dims_symbol_keeps_its_range():
    """An input sized by a derived dim (2 * x) limits x as a plain one does: a feed of 80 had
    run silently on all 80 rows where the module keeps 64 (and torch refuses it)."""
    x = torch.export.Dim("x", min=1, max=32)
    ep = torch.export.export(_FirstRows(), (torch.randn(8),), dynamic_shapes={"a": {0: 2 * x}})
    g = bz.import_torch(ep)
    np.testing.assert_array_equal(bz.interpret(g, {"a": np.ones(8, np.float32)})[0], 2.0)
    with pytest.raises(bz.BrazeError, match=r"input 'a' binds a_dim0 = 40, a size the graph "
                                            r"does not hold for \(a_dim0 >= 32\)"):
        bz.interpret(g, {"a": np.ones(80, np.float32)})


def test_a_slice_end_clamped_for_sizes_2_and_up_refuses_the_size_it_gets_wrong():
    """x[:, :2*seq-2] keeps all of x for seq >= 2 (torch clamps the end to seq); at seq = 1 it
    keeps nothing, where the clamped slice had silently kept the row. That binding is refused
    naming the slice; the others match torch, interpreted and compiled."""
    m = Fn(lambda x: x[:, : x.shape[1] * 2 - 2] * 2).eval()
    g = bz.import_torch(m, (torch.randn(2, 5, 3),), dynamic_shapes={"x": {1: "seq"}})
    exe = bz.compile(g)
    for n in (0, 2, 3, 7):
        x = np.random.default_rng(n).standard_normal((2, n, 3)).astype(np.float32)
        want = m(torch.from_numpy(x)).numpy()
        for got in (bz.interpret(g, {"x": x})[0], exe({"x": x})[0]):
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want)
    x1 = np.ones((2, 1, 3), np.float32)
    for run in (lambda f: bz.interpret(g, f), exe):
        with pytest.raises(bz.BrazeError, match=r"binds seq = 1, .*node slice.*aten\.slice\.Tensor"
                                                r".*decided for seq >= 2"):
            run({"x": x1})


def test_a_size_max_decided_for_sizes_2_and_up_records_the_sizes_it_gets_wrong():
    """SymbolNames decides max(1, s) as s (symbols >= 2) and records that s = 0 decides
    otherwise; s = 1 agrees. The import turns the record into an input exclusion."""
    import sympy

    from braze.frontends.small_sizes import failing_small_bindings
    from braze.frontends.torch.symbolic import SymbolNames

    names = SymbolNames()
    names.bind("s0", "seq")
    assert names.sym(sympy.Max(1, sympy.Symbol("s0"))) == bz.ir.symbolic.SymDim.of("seq")
    ((syms, holds, what),) = names.take_decisions()
    assert failing_small_bindings(syms, holds) == [("seq", 0)] and "seq" in what
    assert names.take_decisions() == []
