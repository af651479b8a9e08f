"""The reference interpreter: the meaning of a braze graph. Evaluates nodes in order with each
op's NumPy reference; float64 mode recomputes everything in double precision for checks.

Every pass is correct iff this gives the same outputs before and after it."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .errors import InterpretError, ShapeError
from .ir.dtypes import f64
from .ir.graph import Graph
from .ir.op import Op
from .ir.ops.elementwise import Cast
from .ir.ops.io import Input, Param, excluded_binding
from .ir.ops.shape import Narrow
from .ir.shapes import Shape
from .ir.symbolic import MIN_SYMBOL_VALUE, SymDim, dim_symbols, eval_dim


def bind_symbols(g: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Bind each symbolic dim of the graph inputs from the feeds; errors name the input.
    Named dims bind first; dims written as expressions ("batch*seq") are then checked."""
    env: dict[str, int] = {}
    later: list[tuple[str, str, Shape, int, tuple]] = []
    for node in g.inputs:
        name, shape = node.op.name, node.op.shape
        if name not in feeds:
            have = ", ".join(sorted(feeds)) or "nothing"
            raise InterpretError(f"graph {g.name!r} needs input {name!r} {shape}; "
                                 f"feeds have {have}")
        arr = np.asarray(feeds[name])
        if arr.ndim != shape.rank:
            raise InterpretError(f"input {name!r} declared {shape} but was fed rank {arr.ndim} "
                                 f"array of shape {arr.shape}")
        for d, actual in zip(shape.dims, arr.shape, strict=True):
            if isinstance(d, int):
                if d != actual:
                    raise InterpretError(f"input {name!r} declared {shape} but was fed shape "
                                         f"{arr.shape}")
            elif not d.isidentifier():
                later.append((name, d, shape, actual, arr.shape))
            elif env.setdefault(d, actual) != actual:
                raise InterpretError(f"symbol {d!r} is {env[d]} elsewhere but input {name!r} "
                                     f"gives {actual}")
    _solve_linear(later, env)
    for name, d, shape, actual, fed in later:
        try:
            want = eval_dim(d, env)
        except KeyError as e:
            raise InterpretError(f"input {name!r} {shape} has dim {d!r} whose symbol {e} no "
                                 "input binds by name") from None
        if want != actual:
            raise InterpretError(f"input {name!r} declared {shape} ({d} = {want}) but was fed "
                                 f"shape {fed}")
    broken = excluded_binding([n.op for n in g.inputs], env)
    if broken is not None:
        raise InterpretError(f"graph {g.name!r}: {broken}")
    return env


def check_small_binding(g: Graph, env: Mapping[str, int]) -> None:
    """Shape inference proves windows fit (a conv's output length >= 1) for symbols >=
    MIN_SYMBOL_VALUE only; a feed may bind a smaller value ("32*h" fed 32 rows is h = 1, or 0
    rows). For such a binding re-infer the graph with it (`Graph.bind`) and, when a node
    cannot take it, raise an InterpretError naming the node, the binding and the symbol."""
    syms = set(g.dynamic_symbols())
    small = {s: v for s, v in env.items() if s in syms and v < MIN_SYMBOL_VALUE}
    if not small:
        return
    bound = {s: v for s, v in env.items() if s in syms}
    try:
        g.bind(bound)
    except ShapeError as e:
        try:  # the same feeds with the small symbols at 2: failing too, it is not about them
            g.bind({**bound, **dict.fromkeys(small, MIN_SYMBOL_VALUE)})
        except ShapeError:
            return
        raise InterpretError(f"the feeds bind {small} (below {MIN_SYMBOL_VALUE}, the smallest "
                             f"value shape inference assumed), which graph {g.name!r} cannot "
                             f"take: {e}; feed a larger input") from None


def check_narrows(g: Graph, env: Mapping[str, int]) -> None:
    """Every `narrow` stays inside its axis under the binding, else an InterpretError naming
    the node (as dynamic_narrow's own check does): an ONNX Slice of a symbolic axis imports
    unclamped (`x[4:-4]` of an axis N is a narrow of N-8 rows, `x[0:6]` one of 6 rows), so
    feeding N = 5 must not run as a negative, or a longer than the input, slice."""
    for n in g.nodes:
        if not isinstance(n.op, Narrow):
            continue
        dims = g.shape_of(n.inputs[0]).dims
        ax = n.op.axis % len(dims)
        try:
            size, length = eval_dim(dims[ax], env), eval_dim(n.op.length, env)
        except KeyError:  # a symbol no feed binds
            continue
        if length < 0 or n.op.start + length > size:
            bound = {k: v for k, v in env.items() if k in set(g.dynamic_symbols())}
            where = f" from {n.provenance}" if n.provenance else ""
            raise InterpretError(
                f"node {n.label}{where} of graph {g.name!r} takes [{n.op.start}, {n.op.start}+"
                f"{n.op.length}) = [{n.op.start}, {n.op.start + length}) of axis {ax}, of size "
                f"{size} for {bound}: the graph was imported assuming this slice needs no "
                "clamping; feed sizes for which it stays inside the axis, or import with "
                "those dims static")


def _solve_linear(later: list, env: dict[str, int]) -> None:
    """Bind the symbol of a dim written `c*name+k` ("32*h", "2*n+1") that no input binds by name:
    name = (actual - k) / c, which must be a whole number >= 0 (an image of 737 rows for
    "32*h" is refused, naming the input and the multiple it needs)."""
    for name, d, shape, actual, fed in later:
        p = SymDim.of(d)
        free = p.symbols - env.keys()
        if len(free) != 1:
            continue
        (sym,) = free
        linear = {m: c for m, c in p.terms.items() if m}
        if list(linear) != [(sym,)]:
            continue
        coef = linear[(sym,)]
        value, rem = divmod(actual - p.const, coef)
        if rem or value < 0:
            what = f"a multiple of {coef}" if not p.const else \
                f"of the form {d} for a whole {sym} >= 0"
            raise InterpretError(f"input {name!r} declared {shape}: dim {d} must be {what}, "
                                 f"but was fed {actual} (shape {fed}); pad or resize the input")
        env[sym] = value


def _resolve(shape: Shape, env: Mapping[str, int]) -> tuple[int, ...]:
    out = []
    for d in shape.dims:
        try:
            out.append(eval_dim(d, env))
        except KeyError:
            out.append(-1)
    return tuple(out)


def interpret(
    g: Graph,
    feeds: Mapping[str, np.ndarray],
    params: Mapping[str, np.ndarray] | None = None,
    *,
    float64: bool = False,
    symbols: Mapping[str, int] | None = None,
) -> list[np.ndarray]:
    """Run `g` on `feeds` (input name -> array) with `params` (name -> array; falls back to
    `g.weights`). Returns the outputs in order. `float64=True` computes in double precision;
    `symbols` binds dims no input binds (a graph that computes from dims alone)."""
    env = {**(symbols or {}), **bind_symbols(g, feeds)}
    weights = dict(g.weights)
    if params:
        weights.update(params)
    last_use = _last_uses(g)
    vals: dict[tuple[int, int], np.ndarray] = {}
    keep = {(v.node, v.index) for v in g.outputs}
    for node in g.nodes:
        op = node.op
        try:
            if isinstance(op, Input):
                out = np.asarray(feeds[op.name])
                if out.dtype != op.shape.dtype.np:
                    raise InterpretError(f"input {op.name!r} declared {op.shape.dtype} but was "
                                         f"fed {out.dtype}; cast the feed")
                outs = (out,)
            elif isinstance(op, Param):
                if op.name not in weights:
                    raise InterpretError(f"param {op.name!r} {op.shape} has no value; pass it in "
                                         "params (bz.init_params(g) draws random ones)")
                w = np.asarray(weights[op.name])
                want = _resolve(op.shape, env)
                if w.shape != want:
                    raise InterpretError(f"param {op.name!r} declared {op.shape} but its value "
                                         f"has shape {w.shape}")
                outs = (w.astype(op.shape.dtype.np, copy=False),)
            else:
                args = [vals[(v.node, v.index)] for v in node.inputs]
                if float64 and isinstance(op, Cast) and op.dtype.is_float:
                    op = Cast(f64)
                if getattr(op, "needs_symbols", False):  # target dims may hold symbols
                    res = op.reference(*args, symbols=env)
                else:
                    res = op.reference(*args)
                outs = res if isinstance(res, tuple) else (res,)
            if float64:
                outs = tuple(_to64(o) for o in outs)
        except InterpretError:
            raise
        except Exception as e:  # name the node, keep the cause
            check_small_binding(g, env)  # a too-small symbol says so instead
            where = f" from {node.provenance}" if node.provenance else ""
            raise InterpretError(f"while executing node {node.label}{where}: "
                                 f"{type(e).__name__}: {e}") from e
        for i, o in enumerate(outs):
            vals[(node.id, i)] = np.asarray(o)
        for v in node.inputs:
            key = (v.node, v.index)
            if last_use.get(key) == node.id and key not in keep:
                vals.pop(key, None)
    return [vals[(v.node, v.index)] for v in g.outputs]


def _to64(x):
    x = np.asarray(x)
    if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
        return x.astype(np.float64)
    return x


def _last_uses(g: Graph) -> dict[tuple[int, int], int]:
    last: dict[tuple[int, int], int] = {}
    for node in g.nodes:
        for v in node.inputs:
            last[(v.node, v.index)] = node.id
    return last


_DECOMP_CACHE: dict = {}


def decomposition_graph(op: Op, in_shapes: Sequence[Shape]) -> Graph:
    """A small graph whose inputs `x0..xn` feed `op.decompose`: the op's primitive meaning."""
    key = (op, tuple(in_shapes))
    try:
        cached = _DECOMP_CACHE.get(key)
    except TypeError:  # unhashable attribute (e.g. a region body); build every time
        cached, key = None, None
    if cached is not None:
        return cached
    g = Graph(f"{op.kind}_decomposition", record_provenance=False)
    ins = [g.input(f"x{i}", s) for i, s in enumerate(in_shapes)]
    out = op.decompose(g, ins)
    g.set_outputs([out] if not isinstance(out, tuple) else list(out))
    if key is not None and len(_DECOMP_CACHE) < 4096:
        _DECOMP_CACHE[key] = g
    return g


def reference_via_decomposition(op: Op, xs: Sequence[np.ndarray]):
    """Evaluate a composite op by interpreting its decomposition on concrete arrays."""
    from .ir.dtypes import dtype_from_numpy

    shapes = [Shape(x.shape, dtype_from_numpy(x.dtype)) for x in xs]
    try:
        g = decomposition_graph(op, shapes)
    except ShapeError as e:
        raise InterpretError(f"{op.kind} cannot decompose for inputs "
                             f"{', '.join(map(str, shapes))}: {e}") from e
    outs = interpret(g, {f"x{i}": x for i, x in enumerate(xs)})
    return outs[0] if len(outs) == 1 else tuple(outs)


def init_params(g: Graph, seed: int = 0, *, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Random values for every param (those in `g.weights` are kept as they are).

    Matrices get N(0, 1/fan_in); vectors N(0, 0.1), shifted to around 1 where an op uses them as
    a scale (norm gamma) and kept positive where an op needs that (batch-norm variance)."""
    rng = np.random.default_rng(seed)
    hints = _param_hints(g)
    out: dict[str, np.ndarray] = {}
    for node in g.params:
        name, shape = node.op.name, node.op.shape
        if name in g.weights:
            out[name] = g.weights[name]
            continue
        if not shape.is_static:
            raise InterpretError(f"param {name!r} has symbolic shape {shape}; give its value")
        dims = shape.dims
        dt = shape.dtype
        if dt.is_int:
            arr = rng.integers(0, 4, size=dims)
        elif dt.kind == "bool":
            arr = rng.random(dims) < 0.5
        else:
            hint = hints.get(name)
            if len(dims) >= 2:
                fan_in = int(np.prod(dims[1:])) if len(dims) == 4 else dims[-2]
                arr = rng.standard_normal(dims) * (scale / np.sqrt(max(fan_in, 1)))
            else:
                arr = rng.standard_normal(dims) * 0.1 * scale
            if hint == "one":
                arr = 1.0 + arr
            elif hint == "positive":
                arr = 0.5 + rng.random(dims)
        out[name] = np.asarray(arr).astype(dt.np)
    return out


def _param_hints(g: Graph) -> dict[str, str]:
    hints: dict[str, str] = {}
    for node in g.nodes:
        hint_fn = getattr(node.op, "param_init_hint", None)
        if hint_fn is None:
            continue
        for pos, v in enumerate(node.inputs):
            src = g.nodes[v.node].op
            if isinstance(src, Param):
                h = hint_fn(pos)
                if h:
                    hints[src.name] = h
    return hints


def random_feeds(g: Graph, seed: int = 0, symbols: Mapping[str, int] | None = None
                 ) -> dict[str, np.ndarray]:
    """Random arrays for every graph input; symbolic dims take `symbols` (default 3)."""
    rng = np.random.default_rng(seed)
    symbols = dict(symbols or {})
    feeds = {}
    for node in g.inputs:
        shape = node.op.shape
        for d in shape.dims:
            if isinstance(d, str) and d.isidentifier():
                symbols.setdefault(d, 3)
        for d in shape.dims:
            for name in dim_symbols(d):
                symbols.setdefault(name, 3)
        dims = tuple(eval_dim(d, symbols) for d in shape.dims)
        dt = shape.dtype
        if dt.is_int:
            hi = getattr(node.op, "int_high", None) or 4
            arr = rng.integers(0, hi, size=dims)
        elif dt.kind == "bool":
            arr = rng.random(dims) < 0.5
        else:
            arr = rng.standard_normal(dims)
        feeds[node.op.name] = np.asarray(arr).astype(dt.np)
    return feeds

__all__ = ["interpret", "init_params", "random_feeds", "bind_symbols", "decomposition_graph"]
