"""ATen ops that import as a gather or a short chain, matched bit for bit against torch:
Tensor.unfold (PatchTST's patches: windows along a dim as a new axis, the window's elements
last; static and symbolic lengths), diagonal (einsum "ii->i") and round(decimals=)."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.errors import FrontendError

torch = pytest.importorskip("torch")


class Method(torch.nn.Module):
    """x.<name>(*args) * 2."""

    def __init__(self, name: str, *args):
        super().__init__()
        self.name, self.args = name, args

    def forward(self, x):
        return getattr(x, self.name)(*self.args) * 2.0


def Unfold(dim: int, size: int, step: int) -> Method:
    return Method("unfold", dim, size, step)


def Diagonal(offset: int, dim1: int, dim2: int) -> Method:
    return Method("diagonal", offset, dim1, dim2)


def _compiled_equals_torch(module, x: np.ndarray):
    """Import `module` at x, compile, and check the output's bits against torch's; the graph."""
    g = bz.import_torch(module, (torch.from_numpy(x),))
    want = module(torch.from_numpy(x)).numpy()
    got = bz.compile(g)({g.inputs[0].name: x})[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    return g


@pytest.mark.parametrize("shape, args", [
    ((2, 32, 3), (1, 8, 8)),         # patches along a middle dim
    ((2, 3, 37), (-1, 8, 4)),        # overlapping windows, a tail left over
    ((5, 6), (0, 2, 1)),
    ((4,), (0, 3, 2)),
    ((2, 3, 10, 4), (2, 4, 3)),
])
def test_unfold_matches_torch(shape, args):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    g = _compiled_equals_torch(Unfold(*args).eval(), x)
    assert g.count("gather") == 1


@pytest.mark.parametrize("size, step", [(8, 8), (8, 4)])
def test_unfold_of_a_length_declared_a_multiple(size, step):
    module = Unfold(-1, size, step).eval()
    g = bz.import_torch(module, (torch.randn(2, 3, 64),),
                        dynamic_shapes={"x": {0: "batch", 2: "8*n"}})
    exe = bz.compile(g)
    rng = np.random.default_rng(1)
    for b, length in ((1, 16), (3, 40)):
        x = rng.standard_normal((b, 3, length)).astype(np.float32)
        np.testing.assert_array_equal(exe({"x": x})[0], module(torch.from_numpy(x)).numpy())


def test_unfold_of_a_plain_dynamic_length_with_a_step_is_a_clear_error():
    with pytest.raises(FrontendError, match=r"unfold.*seq // 8 rounds a division down; .*"
                                            r"declare seq a multiple of 8 in dynamic_shapes "
                                            r"\('8\*seq'\)"):
        bz.import_torch(Unfold(-1, 8, 8).eval(), (torch.randn(2, 3, 64),),
                        dynamic_shapes={"x": {2: "seq"}})


@pytest.mark.parametrize("shape, args", [
    ((5, 5), (0, 0, 1)),
    ((4, 6), (1, 0, 1)),
    ((4, 6), (-2, 0, 1)),
    ((2, 3, 4, 5), (0, 1, 3)),     # the diagonal's dims apart: moved last first
    ((2, 3, 4, 5), (1, -1, 1)),    # dims given in reverse
    ((3, 4), (7, 0, 1)),           # an offset past the matrix: an empty diagonal
])
def test_diagonal_matches_torch(shape, args):
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    g = _compiled_equals_torch(Diagonal(*args).eval(), x)
    assert g.count("gather") == 1


def test_einsum_trace_form_imports():
    class Trace(torch.nn.Module):
        def forward(self, x):
            return torch.einsum("bii->bi", x)

    x = np.random.default_rng(3).standard_normal((2, 4, 4)).astype(np.float32)
    g = bz.import_torch(Trace().eval(), (torch.from_numpy(x),))
    np.testing.assert_array_equal(bz.compile(g)({g.inputs[0].name: x})[0],
                                  np.einsum("bii->bi", x))


class Round(torch.nn.Module):
    def __init__(self, decimals: int):
        super().__init__()
        self.decimals = decimals

    def forward(self, x):
        return torch.round(x, decimals=self.decimals)


@pytest.mark.parametrize("decimals", [3, 1, 0, -1, -2])
def test_round_with_decimals_matches_torch_bit_for_bit(decimals):
    x = (np.random.default_rng(4).standard_normal((8, 500)) * 50).astype(np.float32)
    _compiled_equals_torch(Round(decimals).eval(), x)


class SortAndTopK(torch.nn.Module):
    """torch.topk and torch.sort (both directions), values and indices."""

    def forward(self, x):
        big, small = x.topk(3, -1), x.topk(3, -1, largest=False)
        up, down = x.sort(dim=-1, stable=True), x.sort(dim=-1, descending=True, stable=True)
        return (big.values, small.values, up.values, up.indices, down.values, down.indices)


def test_topk_and_sort_rank_nan_as_torch():
    """torch ranks NaN above +inf: topk(largest) and a descending sort put it first, the
    ascending ones last; the imported graph agrees, interpreted and compiled."""
    x = np.array([[1, np.nan, np.inf, -1, np.nan, -np.inf],
                  [np.nan, 2, 3, -2, 0.5, np.nan]], np.float32)
    m = SortAndTopK()
    g = bz.import_torch(m, (torch.from_numpy(x),))
    want = [t.numpy() for t in m(torch.from_numpy(x))]
    for got in (bz.interpret(g, {g.inputs[0].name: x}), bz.compile(g)({g.inputs[0].name: x})):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


class _ClampU8(torch.nn.Module):
    def forward(self, x):
        return x.clamp(-2, 2), x.clamp(min=-1), torch.clamp_max(x, 7), x.clamp(1, 9)


def test_a_negative_clamp_bound_of_a_uint8_tensor_wraps_as_in_torch():
    """torch reads int bound -2 of a uint8 tensor as 254 (clamp(254, 2): every element 2;
    clamp(min=-1): every element 255); braze had compared against -2 and kept x."""
    x = np.array([[0, 1, 3, 200, 255]], np.uint8)
    m = _ClampU8()
    g = bz.import_torch(m, (torch.from_numpy(x),))
    want = [t.numpy() for t in m(torch.from_numpy(x))]
    for got in (bz.interpret(g, {"x": x}), bz.compile(g)({"x": x})):
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


class _BoolArithmetic(torch.nn.Module):
    def forward(self, x, y):
        a, b = x > 0, y > 0
        return a * b, a + b, torch.logaddexp(x, y)


def test_bool_mul_and_add_are_and_and_or_as_in_torch():
    """torch's bool * bool is and, bool + bool is or (its own decomposition of logaddexp
    multiplies two masks); they were refused ("mul needs numeric operands")."""
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((3, 7)).astype(np.float32) for _ in range(2))
    x[0, 0], y[0, 1] = np.inf, -np.inf
    m = _BoolArithmetic()
    g = bz.import_torch(m, (torch.from_numpy(x), torch.from_numpy(y)))
    want = [t.numpy() for t in m(torch.from_numpy(x), torch.from_numpy(y))]
    for got in (bz.interpret(g, {"x": x, "y": y}), bz.compile(g)({"x": x, "y": y})):
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
