"""`bz.import_torch` of torch.scatter (tensor and scalar sources, the deprecated reduce="add" /
"multiply"), scatter_add and scatter_reduce (sum, prod, mean, amax, amin, with and without
include_self) on float and integer data, indices smaller than the source and the data, repeated
indices (the last write wins, as on torch's CPU), and a dynamic dim; each checked through the
interpreter and the compiled CPU executor against PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import braze as bz  # noqa: E402

FORMS = {
    "scatter": lambda x, d, i, u: torch.scatter(x, d, i, u),
    "scatter_value": lambda x, d, i, u: x.scatter(d, i, 1.5),
    "scatter_add": lambda x, d, i, u: torch.scatter_add(x, d, i, u),
    "reduce_add": lambda x, d, i, u: x.scatter(d, i, u, reduce="add"),
    "reduce_multiply": lambda x, d, i, u: x.scatter(d, i, u, reduce="multiply"),
    "value_multiply": lambda x, d, i, u: x.scatter(d, i, 2.0, reduce="multiply"),
    **{f"{r}{'' if keep else '_exclude_self'}": (
        lambda x, d, i, u, r=r, keep=keep: x.scatter_reduce(d, i, u, r, include_self=keep))
       for r in ("sum", "prod", "mean", "amax", "amin") for keep in (True, False)},
}
CASES = [((4, 7), (3, 5), (4, 6), 1), ((5, 3, 4), (2, 3, 3), (2, 3, 4), 0),
         ((6,), (4,), (5,), 0), ((3, 5), (3, 2), (3, 2), -1)]


PLAIN = ("scatter", "scatter_value")  # repeated writes are unspecified: distinct indices


class Scatters(torch.nn.Module):
    """Every form in `forms` along `dim`: the plain scatters read `distinct`, the reductions
    `repeated` indices."""

    def __init__(self, forms, dim: int):
        super().__init__()
        self.forms, self.dim = tuple(forms), dim

    def forward(self, x, distinct, repeated, u):
        return tuple(FORMS[f](x, self.dim, distinct if f in PLAIN else repeated, u)
                     for f in self.forms)


def _distinct(rng, n, idims, axis):
    order = np.argsort(rng.random(idims[:axis] + (n,) + idims[axis + 1:]), axis=axis)
    return np.take(order, np.arange(idims[axis]), axis=axis).astype(np.int64)


def _check(m, args, dynamic_shapes=None, runs=()):
    g = bz.import_torch(m, tuple(torch.from_numpy(a) for a in args),
                        dynamic_shapes=dynamic_shapes)
    names = [n.op.name for n in g.inputs]
    exe = bz.compile(g, "cpu")
    for arrays in (args, *runs):
        with torch.no_grad():
            want = m(*(torch.from_numpy(a) for a in arrays))
        want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
        feeds = dict(zip(names, arrays))
        for how, got in (("interpret", bz.interpret(g, feeds)), ("compiled", exe(feeds))):
            assert len(got) == len(want)
            for form, a, b in zip(getattr(m, "forms", ("",)), got, want):
                assert a.shape == b.shape and a.dtype == b.dtype, (how, form)
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"{how} {form}")
    return g


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("dims, idims, sdims, dim", CASES)
def test_float_scatters_match_pytorch(dims, idims, sdims, dim):
    rng = np.random.default_rng(len(dims) + dim)
    ax = dim % len(dims)
    x = (rng.standard_normal(dims) * 3).astype(np.float32)
    repeated = rng.integers(0, dims[ax], idims).astype(np.int64)
    u = (rng.standard_normal(sdims) * 3).astype(np.float32)
    _check(Scatters(sorted(FORMS), dim).eval(),
           (x, _distinct(rng, dims[ax], idims, ax), repeated, u))


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_integer_scatters_match_pytorch():
    """Integer means floor, as torch's do."""
    rng = np.random.default_rng(7)
    forms = sorted(f for f in FORMS if "value" not in f)
    _check(Scatters(forms, 1).eval(), (rng.integers(-9, 9, (4, 7)),
                                       _distinct(rng, 7, (3, 5), 1),
                                       rng.integers(0, 7, (3, 5)), rng.integers(-9, 9, (4, 6))))


def test_repeated_indices_keep_the_last_write():
    rng = np.random.default_rng(8)
    i = np.array([[0, 2, 0, 2, 1, 0]], np.int64)
    _check(Scatters(["scatter"], 1).eval(), (np.zeros((1, 4), np.float32), i, i,
                                             rng.standard_normal((1, 6)).astype(np.float32)))


def test_scatter_add_over_a_dynamic_batch():
    rng = np.random.default_rng(9)

    def args(b):
        i = rng.integers(0, 6, (b, 4)).astype(np.int64)
        return (rng.standard_normal((b, 6)).astype(np.float32), i, i,
                rng.standard_normal((b, 4)).astype(np.float32))

    g = _check(Scatters(["scatter_add"], 1).eval(), args(3),
               dynamic_shapes={k: {0: "b"} for k in ("x", "distinct", "repeated", "u")},
               runs=[args(5)])
    assert g.shape_of(g.outputs[0]).dims == ("b", 6)


class CacheWrite(torch.nn.Module):
    """A static KV cache written at `pos` along axis 2: index_copy (in place or not), slice
    assignment with a broadcast value, and index_put's accumulate (aten.index_put with one
    integer index tensor)."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, cache, new, pos):
        cache = cache.clone()
        if self.how == "index_copy":
            return cache.index_copy(2, pos, new)
        if self.how == "index_copy_":
            cache.index_copy_(2, pos, new)
        elif self.how == "setitem":
            cache[:, :, pos] = new[:, :1]  # the value broadcasts over the heads
        else:
            cache = torch.ops.aten.index_put.default(cache, [None, None, pos], new, True)
        return cache


@pytest.mark.parametrize("how", ["index_copy", "index_copy_", "setitem", "accumulate"])
def test_one_integer_index_put_is_a_scatter(how):
    """It had been refused ('boolean mask and a scalar value only'), so no static-cache decoder
    imported; negative positions count from the end, as in torch's index_put."""
    rng = np.random.default_rng(10)

    def args(b, pos):
        return (rng.standard_normal((b, 3, 8, 4)).astype(np.float32),
                rng.standard_normal((b, 3, len(pos), 4)).astype(np.float32),
                np.array(pos, np.int64))

    g = _check(CacheWrite(how).eval(), args(2, [1, 2, 3]),
               dynamic_shapes={"cache": {0: "b"}, "new": {0: "b", 2: "s"}, "pos": {0: "s"}},
               runs=[args(3, [7]), args(1, [0, 6 if "copy" in how else -1, 4, 5])])
    assert g.shape_of(g.outputs[0]).dims == ("b", 3, 8, 4)
