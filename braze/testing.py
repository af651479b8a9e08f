"""Test helpers for braze and its users: numeric equivalence of two graphs, and hypothesis
strategies for random valid graphs.

    from braze.testing import assert_equivalent, random_graphs

    assert_equivalent(g, fused)              # fresh random feeds + params per seed, all outputs

    @given(random_graphs(max_nodes=12))
    def test_pass_keeps_meaning(g):
        assert_equivalent(g, my_pass(g))

`random_graphs` draws graphs of elementwise (unary, binary with broadcasting against other
values, new params or scalar constants), matmul, reshape, transpose and reduce ops over f32
inputs (optionally with a symbolic leading dim `batch`), with values used by several nodes,
1-3 graph outputs, and some node names and provenance strings. hypothesis is imported only
when `random_graphs` is called."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import ShapeError
from .interpret import init_params, interpret, random_feeds
from .ir.graph import Graph

__all__ = ["assert_equivalent", "random_graphs"]


def assert_equivalent(
    before: Graph,
    after: Graph,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    seeds: Sequence[int] = (0, 1),
    params: Mapping[str, np.ndarray] | None = None,
    symbols: Mapping[str, int] | None = None,
    float64: bool = False,
) -> None:
    """Interpret both graphs on fresh random inputs per seed and compare every output.

    Feeds come from `random_feeds(before, seed, symbols)`; params are `params` if given, else
    `init_params(before, seed)`, and both graphs get the same ones. Raises AssertionError naming
    the seed, output index, max abs difference and where it occurs."""
    for seed in seeds:
        feeds = random_feeds(before, seed, symbols)
        ps = dict(params) if params is not None else init_params(before, seed)
        want = interpret(before, feeds, ps, float64=float64)
        got = interpret(after, feeds, ps, float64=float64)
        if len(want) != len(got):
            raise AssertionError(f"seed {seed}: {before.name!r} has {len(want)} outputs, "
                                 f"{after.name!r} has {len(got)}")
        for i, (w, a) in enumerate(zip(want, got)):
            _compare(np.asarray(w), np.asarray(a), i, len(want), seed, rtol, atol)


def _compare(w: np.ndarray, a: np.ndarray, i: int, n: int, seed: int, rtol: float, atol: float
             ) -> None:
    where = f"seed {seed}: output {i} of {n}"
    if w.shape != a.shape:
        raise AssertionError(f"{where}: shape {w.shape} before, {a.shape} after")
    if w.dtype != a.dtype:
        raise AssertionError(f"{where}: dtype {w.dtype} before, {a.dtype} after")
    if w.dtype.kind in "biuUS" or w.dtype.kind == "O":
        bad = w != a
        if not bad.any():
            return
        pos = np.unravel_index(int(np.argmax(bad)), w.shape) if w.ndim else ()
        raise AssertionError(f"{where}: {int(bad.sum())} of {w.size} elements differ; first at "
                             f"{tuple(int(p) for p in pos)}: before={w[pos].item()!r} "
                             f"after={a[pos].item()!r}")
    cast = np.complex128 if w.dtype.kind == "c" else np.float64
    w64, a64 = w.astype(cast), a.astype(cast)
    close = np.isclose(a64, w64, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return
    diff = np.where(close, 0.0, np.abs(a64 - w64))
    diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only counts as worst
    k = int(np.argmax(diff))
    pos = np.unravel_index(k, w.shape) if w.ndim else ()
    raise AssertionError(
        f"{where}: {int((~close).sum())} of {w.size} elements outside rtol={rtol}, atol={atol}; "
        f"max abs diff {diff.reshape(-1)[k]:.6g} at {tuple(int(p) for p in pos)}: "
        f"before={w64[pos].item()!r} after={a64[pos].item()!r}")


# -- random graphs ------------------------------------------------------------------------------
_UNARY = ("relu", "tanh", "sigmoid", "neg", "abs", "gelu", "silu", "square")
_BINARY = ("add", "sub", "mul", "max", "min")
_FAMILIES = ("unary", "binary", "binary", "matmul", "reshape", "transpose", "reduce")


def random_graphs(max_nodes: int = 12, *, symbolic: bool = True, max_inputs: int = 3) -> Any:
    """A hypothesis strategy for random valid graphs with up to `max_nodes` compute nodes (see
    the module docstring). `symbolic=False` keeps every dim static."""
    from hypothesis import strategies as st

    @st.composite
    def graphs(draw):
        return _draw_graph(draw, st, max_nodes, symbolic, max_inputs)

    return graphs()


def _draw_graph(draw, st, max_nodes: int, symbolic: bool, max_inputs: int) -> Graph:
    from .ir.ops.elementwise import Binary, BinaryFn, Unary, UnaryFn
    from .ir.ops.linalg import MatMul
    from .ir.shapes import Shape

    g = Graph(draw(st.sampled_from(["random", "g", "model_1"])), record_provenance=False)
    dims = st.integers(1, 4)
    vals = []
    for i in range(draw(st.integers(1, max_inputs))):
        rank = draw(st.integers(1, 3))
        shape = list(draw(st.lists(dims, min_size=rank, max_size=rank)))
        if symbolic and rank >= 2 and draw(st.booleans()):
            shape[0] = "batch"
        vals.append(g.input(f"x{i}", Shape(tuple(shape))))
    n_params = 0

    def new_param(shape):
        nonlocal n_params
        n_params += 1
        return g.param(f"w{n_params}", Shape(tuple(shape)))

    def extras(k: int) -> dict:
        name = f"v{k}" if draw(st.integers(0, 3)) == 0 else None
        prov = draw(st.sampled_from([None, None, f"gen.py:{k}", "layer.0/mlp"]))
        return {"name": name, "provenance": prov}

    n_nodes = draw(st.integers(1, max_nodes))
    for k in range(n_nodes):
        family = draw(st.sampled_from(_FAMILIES))
        x = draw(st.sampled_from(vals))
        xs = g.shape_of(x)
        try:
            if family == "unary":
                fn = UnaryFn(draw(st.sampled_from(_UNARY)))
                v = g.add_node(Unary(fn), (x,), **extras(k))[0]
            elif family == "binary":
                y = _draw_operand(draw, st, g, vals, xs, new_param)
                fn = BinaryFn(draw(st.sampled_from(_BINARY)))
                a, b = (x, y) if draw(st.booleans()) else (y, x)
                v = g.add_node(Binary(fn), (a, b), **extras(k))[0]
            elif family == "matmul":
                if xs.rank == 0 or not isinstance(xs.dims[-1], int):
                    continue
                w = new_param((xs.dims[-1], draw(dims)))
                v = g.add_node(MatMul(), (x, w), **extras(k))[0]
            else:
                v = _draw_shape_op(draw, st, g, family, x, xs)
                if v is None:
                    continue
        except ShapeError:
            continue
        vals.append(v)
    computed = [v for v in vals if not g.nodes[v.node].op.source] or vals
    outs = [computed[-1]]
    for v in draw(st.lists(st.sampled_from(computed), max_size=2)):
        if v not in outs:
            outs.append(v)
    g.set_outputs(outs)
    return g


def _draw_operand(draw, st, g: Graph, vals, xs, new_param):
    """Another value that broadcasts with shape `xs`: an existing one, a param or a scalar."""
    from .ir.shapes import broadcast_dims

    choice = draw(st.integers(0, 2))
    if choice == 0:
        fits = []
        for v in vals:
            try:
                broadcast_dims(xs.dims, g.shape_of(v).dims)
                fits.append(v)
            except ShapeError:
                pass
        return draw(st.sampled_from(fits))
    if choice == 1:
        keep = draw(st.integers(0, xs.rank))
        tail = xs.dims[xs.rank - keep:]
        shape = [1 if not isinstance(d, int) or draw(st.integers(0, 3)) == 0 else d
                 for d in tail]
        return new_param(shape)
    return g.constant(np.float32(draw(st.sampled_from([0.5, -1.0, 2.0, 3.25]))))


def _draw_shape_op(draw, st, g: Graph, family: str, x, xs):
    """reshape / transpose / reduce of `x`, when the builder has them; None to skip."""
    if family == "reshape" and hasattr(g, "reshape"):
        lead = [d for d in xs.dims if not isinstance(d, int)][:1]
        static = [d for d in xs.dims if isinstance(d, int)]
        if lead and xs.dims[0] != lead[0]:
            return None
        n = int(np.prod(static)) if static else 1
        if draw(st.booleans()) or n == 1:
            target = lead + [n]
        else:
            f = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
            target = lead + [f, n // f]
        return g.reshape(x, tuple(target))
    if family == "transpose" and hasattr(g, "transpose") and xs.rank >= 2:
        perm = draw(st.permutations(list(range(xs.rank))))
        return g.transpose(x, tuple(perm))
    if family == "reduce" and hasattr(g, "reduce") and xs.rank >= 1:
        axes = draw(st.lists(st.integers(0, xs.rank - 1), min_size=1, max_size=xs.rank,
                             unique=True))
        fn = draw(st.sampled_from(["sum", "mean", "max"]))
        return g.reduce(x, fn, tuple(sorted(axes)), keepdims=draw(st.booleans()))
    return None
