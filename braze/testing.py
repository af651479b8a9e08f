"""Test helpers for braze and its users: numeric equivalence of two graphs, and hypothesis
strategies for random valid graphs.

    from braze.testing import assert_equivalent, random_graphs, random_transformer_graphs

    assert_equivalent(g, fused)              # fresh random feeds + params per seed, all outputs

    @given(random_graphs(max_nodes=12))
    def test_pass_keeps_meaning(g):
        assert_equivalent(g, my_pass(g))

`random_graphs` draws graphs of elementwise (unary, binary with broadcasting against other
values, new params or scalar constants, or a value with itself), matmul, reshape, transpose and
reduce ops over f32 inputs (optionally with a symbolic leading dim `batch`), plus the motifs
fusions look for, each with the near misses they must refuse: linear layers (biases of every
broadcasting shape, applied with add or another op, in either operand order, then an
activation), norms (of a residual sum, gamma / beta params or computed vectors) and gated MLPs.
Values are used by several nodes; 1-3 graph outputs; some node names and provenance strings.
`random_transformer_graphs` draws whole transformer layers with perturbations (see there).
hypothesis is imported only when a strategy is called."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import ShapeError
from .interpret import init_params, interpret, random_feeds
from .ir.graph import Graph

__all__ = ["assert_equivalent", "random_graphs", "random_transformer_graphs"]


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
_ACTS = ("gelu", "gelu_approx", "relu", "silu", "tanh", "sigmoid", "quick_gelu")
_BINARY = ("add", "sub", "mul", "max", "min")
_BIAS_OPS = ("add", "add", "add", "add", "sub", "mul", "max")
_FAMILIES = ("unary", "binary", "binary", "matmul", "reshape", "transpose", "reduce",
             "linear", "linear", "norm", "gated", "self")


def random_graphs(max_nodes: int = 12, *, symbolic: bool = True, max_inputs: int = 3) -> Any:
    """A hypothesis strategy for random valid graphs with about `max_nodes` compute nodes (see
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
        if sum(1 for n in g.nodes if not n.op.source) >= n_nodes:
            break
        family = draw(st.sampled_from(_FAMILIES))
        x = draw(st.sampled_from(vals))
        xs = g.shape_of(x)
        try:
            if family == "unary":
                fn = UnaryFn(draw(st.sampled_from(_UNARY)))
                made = [g.add_node(Unary(fn), (x,), **extras(k))[0]]
            elif family == "binary":
                y = _draw_operand(draw, st, g, vals, xs, new_param)
                fn = BinaryFn(draw(st.sampled_from(_BINARY)))
                a, b = (x, y) if draw(st.booleans()) else (y, x)
                made = [g.add_node(Binary(fn), (a, b), **extras(k))[0]]
            elif family == "self":
                fn = BinaryFn(draw(st.sampled_from(_BINARY)))
                made = [g.add_node(Binary(fn), (x, x), **extras(k))[0]]
            elif family == "matmul":
                if xs.rank == 0 or not isinstance(xs.dims[-1], int):
                    continue
                w = new_param((xs.dims[-1], draw(dims)))
                made = [g.add_node(MatMul(), (x, w), **extras(k))[0]]
            elif family in _MOTIFS:
                made = _MOTIFS[family](draw, st, g, vals, x, xs, new_param)
            else:
                v = _draw_shape_op(draw, st, g, family, x, xs)
                made = [] if v is None else [v]
        except ShapeError:
            continue
        vals.extend(made)
    computed = [v for v in vals if not g.nodes[v.node].op.source] or vals
    outs = [computed[-1]]
    for v in draw(st.lists(st.sampled_from(computed), max_size=2)):
        if v not in outs:
            outs.append(v)
    g.set_outputs(outs)
    return g


def _draw_operand(draw, st, g: Graph, vals, xs, new_param):
    """Another value that broadcasts with shape `xs`: an existing one, a param or a scalar."""
    choice = draw(st.integers(0, 2))
    if choice == 0:
        return draw(st.sampled_from(_broadcasting(g, vals, xs)))
    if choice == 1:
        keep = draw(st.integers(0, xs.rank))
        tail = xs.dims[xs.rank - keep:]
        shape = [1 if not isinstance(d, int) or draw(st.integers(0, 3)) == 0 else d
                 for d in tail]
        return new_param(shape)
    return g.constant(np.float32(draw(st.sampled_from([0.5, -1.0, 2.0, 3.25]))))


def _broadcasting(g: Graph, vals, xs) -> list:
    """The values of `vals` that broadcast with shape `xs` (possibly enlarging it)."""
    from .ir.shapes import broadcast_dims

    fits = []
    for v in vals:
        try:
            broadcast_dims(xs.dims, g.shape_of(v).dims)
            fits.append(v)
        except ShapeError:
            pass
    return fits


def _draw_linear(draw, st, g: Graph, vals, x, xs, new_param) -> list:
    """x @ w, then a bias (a [N] vector, or one of the shapes and ops a fusion must refuse:
    [1], [k] enlarging a [.., 1] product, [1, N], an existing value, the product itself;
    add / sub / mul / max in either operand order), then maybe an activation."""
    if xs.rank == 0 or not isinstance(xs.dims[-1], int):
        return []
    n = draw(st.sampled_from([1, 1, 2, 3, 4]))
    mm = g.matmul(x, new_param((xs.dims[-1], n)))
    made = [mm]
    kind = draw(st.sampled_from(["vector", "vector", "one", "wide", "row", "existing", "self",
                                 "none"]))
    if kind != "none":
        if kind == "vector" or (kind == "wide" and n > 1):
            b = new_param((n,))
        elif kind == "one":
            b = new_param((1,))
        elif kind == "wide":
            b = new_param((draw(st.integers(2, 4)),))
        elif kind == "row":
            b = new_param((draw(st.sampled_from([1, 2])), n))
        elif kind == "existing" and _broadcasting(g, vals, g.shape_of(mm)):
            b = draw(st.sampled_from(_broadcasting(g, vals, g.shape_of(mm))))
        elif kind == "existing":
            b = new_param((n,))
        else:
            b = mm
        fn = draw(st.sampled_from(_BIAS_OPS))
        made.append(g.binary(*((mm, b) if draw(st.booleans()) else (b, mm)), fn))
    if draw(st.booleans()):
        made.append(g.activation(made[-1], draw(st.sampled_from(_ACTS))))
    return made


def _draw_norm(draw, st, g: Graph, vals, x, xs, new_param) -> list:
    """layer_norm / rms_norm over the last axis of x or of a residual sum x + r (r of x's shape,
    or one that broadcasts, possibly enlarging), with gamma / beta params or computed [D]
    values (possibly the sum itself)."""
    if xs.rank == 0 or not isinstance(xs.dims[-1], int):
        return []
    d = xs.dims[-1]
    made = []
    s = x
    if draw(st.booleans()):
        same = [v for v in vals if g.shape_of(v) == xs]
        pool = same + (_broadcasting(g, vals, xs) if draw(st.integers(0, 3)) == 0 else [])
        r = draw(st.sampled_from(pool))
        s = g.add(*((x, r) if draw(st.booleans()) else (r, x)))
        made.append(s)
    vectors = [v for v in vals + made if g.shape_of(v).dims == (d,)]

    def affine():
        choice = draw(st.integers(0, 3))
        if choice == 0 or (choice == 3 and not vectors):
            return None
        return new_param((d,)) if choice < 3 else draw(st.sampled_from(vectors))

    gamma = affine()
    beta = affine() if gamma is not None else None
    if draw(st.booleans()):
        made.append(g.layer_norm(s, gamma, beta, eps=draw(st.sampled_from([1e-5, 1e-6]))))
    else:
        made.append(g.rms_norm(s, gamma, beta, eps=draw(st.sampled_from([1e-5, 1e-6]))))
    return made


def _draw_gated(draw, st, g: Graph, vals, x, xs, new_param) -> list:
    """A gated MLP: act(x @ wg) * (x' @ wu) (x' usually x, wu usually wg's shape), or
    act(h[a]) * h[b] over two narrows of one projection h (usually its two halves)."""
    if xs.rank == 0 or not isinstance(xs.dims[-1], int):
        return []
    k = xs.dims[-1]
    n = draw(st.integers(1, 3))
    act = draw(st.sampled_from(_ACTS))
    if draw(st.booleans()):
        same_k = [v for v in vals if g.shape_of(v).rank and g.shape_of(v).dims[-1] == k]
        x_up = x if draw(st.integers(0, 3)) else draw(st.sampled_from(same_k))
        gate = g.matmul(x, new_param((k, n)))
        up = g.matmul(x_up, new_param((k, n if draw(st.integers(0, 3)) else 1)))
        made = [gate, up]
    else:
        width = 2 * n + (1 if draw(st.integers(0, 4)) == 0 else 0)
        h = g.matmul(x, new_param((k, width)))
        first = draw(st.booleans())
        gate = g.narrow(h, -1, 0 if first else width - n, n)
        up = g.narrow(h, -1, width - n if first else 0, n)
        made = [h, gate, up]
    if act == "silu" and draw(st.booleans()):
        a = g.mul(gate, g.sigmoid(gate))                      # silu written out
    else:
        a = g.activation(gate, act)
    made += [a, g.mul(*((a, up) if draw(st.booleans()) else (up, a)))]
    return made


_MOTIFS = {"linear": _draw_linear, "norm": _draw_norm, "gated": _draw_gated}


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


# -- random transformer layers --------------------------------------------------------------------
def random_transformer_graphs(max_layers: int = 2, *, symbolic: bool = True) -> Any:
    """A hypothesis strategy for transformer layers written in primitives as frameworks export
    them, with the perturbations fusion rules must notice.

    Layers are post-norm (BERT: LayerNorm after each residual add) or pre-norm (LLaMA, GPT-2:
    a norm before attention and MLP), with LayerNorm or RMSNorm, separate or fused (narrowed)
    q/k/v projections, GQA heads, optional rope (rotate-half, interleaved, partial), no / causal
    / sliding-window / custom-mask attention, and a plain (any activation) or gated MLP (two
    matmuls or two halves of one). Dims are odd sizes (head dim 1..6, MLP width 1..5, hidden
    not always heads * head_dim) and batch / seq may be the symbols "batch" / "seq"; linear
    layers may flatten to [batch*seq, E]. Perturbations: biases of other shapes ([1], [1, N],
    [S, N], a [k] bias enlarging a width-1 product) or applied with sub / mul, swapped operand
    orders, silu written as x * sigmoid(x), rope on q only, k/v read from another input, extra
    consumers of interior values and interior values returned as graph outputs."""
    from hypothesis import strategies as st

    @st.composite
    def graphs(draw):
        return _LayerDraw(draw, st, symbolic).build(max_layers)

    return graphs()


class _LayerDraw:
    """Draws one transformer stack; `interior` collects values perturbations may expose."""

    def __init__(self, draw, st, symbolic: bool):
        from .ir.shapes import Shape

        self.draw, self.st, self.Shape = draw, st, Shape
        self.g = Graph(self.pick(["layers", "bert", "llama"]), record_provenance=False)
        self.interior: list = []
        self.n_params = 0
        self.batch = self.pick([1, 2] + (["batch"] if symbolic else [3]))
        self.seq = self.pick([1, 2, 3] + (["seq"] if symbolic else [4]))
        self.heads = self.pick([1, 2, 3, 4])
        self.kv_heads = self.pick([h for h in (1, 2, 3, 4) if self.heads % h == 0])
        self.head_dim = self.pick([1, 2, 3, 4, 6])
        width = self.heads * self.head_dim
        self.hidden = width if self.chance(75) else self.pick([2, 3, 5])
        self.pre = self.chance(50)
        self.rms = self.chance(60 if self.pre else 25)
        self.beta = not self.rms and self.chance(85)
        self.fused_qkv = self.chance(35)
        self.bias = self.chance(50)
        self.flatten = self.chance(20)
        self.mlp = self.pick(["plain", "plain", "gated", "gated_halves"])
        self.act = self.pick(list(_ACTS))
        self.inter = self.pick([1, 2, 3, 5])
        self.rope = self.pick(["none", "half", "interleaved", "partial"]) \
            if self.head_dim % 2 == 0 else "none"
        self.mask = self.pick(["none", "causal", "sliding_window", "custom"])

    # -- drawing helpers ------------------------------------------------------------------------
    def pick(self, options):
        return self.draw(self.st.sampled_from(options))

    def chance(self, percent: int) -> bool:
        return self.draw(self.st.integers(0, 99)) < percent

    def param(self, dims) -> Any:
        self.n_params += 1
        return self.g.param(f"p{self.n_params}", self.Shape(tuple(dims)))

    def keep(self, v):
        self.interior.append(v)
        return v

    # -- layers -----------------------------------------------------------------------------------
    def build(self, max_layers: int) -> Graph:
        g = self.g
        x = g.input("hidden", self.Shape((self.batch, self.seq, self.hidden)))
        self.other = x
        self.tables = self._rope_tables() if self.rope != "none" else None
        self.mask_in = None
        if self.mask == "custom":
            self.mask_in = g.input("mask", self.Shape((self.batch, 1, 1, self.seq)))
        for _ in range(self.draw(self.st.integers(1, max_layers))):
            x = self.layer(x)
        if self.chance(30):
            x = self.norm(x)
        outs = [x]
        for _ in range(self.draw(self.st.integers(0, 2))):
            v = self.pick(self.interior)
            if self.chance(50):                               # an interior value returned
                outs.append(v)
            else:                                             # ... or read once more
                outs.append(g.activation(v, self.pick(["tanh", "neg", "square"])))
        g.set_outputs(list(dict.fromkeys(outs)))
        return g

    def layer(self, x):
        if self.pre:
            h = self.residual(x, self.attention(self.norm(x)))
            return self.residual(h, self.mlp_block(self.norm(h)))
        h = self.norm(self.residual(x, self.attention(x)))
        return self.norm(self.residual(h, self.mlp_block(h)))

    def residual(self, x, y):
        return self.keep(self.g.add(*((x, y) if self.chance(70) else (y, x))))

    def norm(self, x):
        g = self.g
        d = g.shape_of(x).dims[-1]
        gamma = self.param((d,)) if self.chance(90) else None
        beta = self.param((d,)) if self.beta and gamma is not None else None
        if self.rms:
            return self.keep(g.rms_norm(x, gamma, beta, eps=1e-6))
        return self.keep(g.layer_norm(x, gamma, beta, eps=1e-5))

    def dense(self, x, n_out: int, *, may_widen: bool = False):
        """x @ w (+ a bias drawn with its perturbations), flattened to [B*S, E] sometimes."""
        g = self.g
        k = g.shape_of(x).dims[-1]
        flat = self.flatten and g.shape_of(x).rank == 3
        if flat:
            x = self.keep(g.reshape(x, (-1, k)))
        y = self.keep(g.matmul(x, self.param((k, n_out))))
        y = self._bias(y, n_out, flat, may_widen and n_out == 1)
        if flat:
            y = self.keep(g.reshape(y, (self.batch, self.seq, -1)))
        return y

    def _bias(self, y, n: int, flat: bool, may_widen: bool):
        g = self.g
        if not self.bias and self.chance(85):
            return y
        kinds = ["vector"] * 6 + ["one", "row", "none"]
        if not flat and isinstance(self.seq, int):
            kinds.append("seq")
        if may_widen:
            kinds += ["wide", "wide"]
        kind = self.pick(kinds)
        if kind == "none":
            return y
        dims = {"vector": (n,), "one": (1,), "row": (1, n), "seq": (self.seq, n),
                "wide": (self.pick([2, 3]),)}[kind]
        fn = "add" if self.chance(85) else self.pick(["sub", "mul"])
        b = self.param(dims)
        return self.keep(g.binary(*((y, b) if self.chance(70) else (b, y)), fn))

    def heads_of(self, t, n_heads: int):
        g = self.g
        split = self.keep(g.reshape(t, (self.batch, self.seq, n_heads, self.head_dim)))
        return self.keep(g.transpose(split, (0, 2, 1, 3)))

    def attention(self, x):
        g = self.g
        d, hq, hkv = self.head_dim, self.heads, self.kv_heads
        if self.fused_qkv:
            both = self.dense(x, (hq + 2 * hkv) * d)
            q, k, v = (self.keep(g.narrow(both, -1, start * d, n * d))
                       for start, n in ((0, hq), (hq, hkv), (hq + hkv, hkv)))
        else:
            kv_src = self.other if self.chance(8) else x       # cross-attention: no fusion
            q = self.dense(x, hq * d)
            k, v = self.dense(kv_src, hkv * d), self.dense(kv_src, hkv * d)
        q, k, v = self.heads_of(q, hq), self.heads_of(k, hkv), self.heads_of(v, hkv)
        if self.tables is not None:
            cos, sin = self.tables
            n_rot = d // 2 if self.rope == "partial" and d % 4 == 0 else None
            inter = self.rope == "interleaved"
            q = self.keep(g.rope(q, cos, sin, inter, n_rot))
            if self.chance(92):                               # rope on q only: no fusion
                k = self.keep(g.rope(k, cos, sin, inter, n_rot))
        scale = None if self.chance(80) else 0.5
        if self.mask == "custom":
            ctx = g.attention(q, k, v, self.mask_in, scale=scale)
        elif self.mask == "sliding_window":
            ctx = g.attention(q, k, v, kind="sliding_window", window=2, scale=scale)
        else:
            ctx = g.attention(q, k, v, kind=self.mask, scale=scale)
        self.keep(ctx)
        merged = self.keep(g.transpose(ctx, (0, 2, 1, 3)))
        merged = self.keep(g.reshape(merged, (self.batch, self.seq, hq * d)))
        return self.dense(merged, self.hidden)

    def mlp_block(self, h):
        g = self.g
        n = self.inter
        if self.mlp == "plain":
            up = self.dense(h, n, may_widen=True)
            a = self.keep(g.activation(up, self.act))
            return self.dense(a, self.hidden)
        if self.mlp == "gated":
            gate, up = self.dense(h, n), self.dense(h, n)
        else:
            both = self.dense(h, 2 * n)
            first = self.chance(70)
            gate = self.keep(g.narrow(both, -1, 0 if first else n, n))
            up = self.keep(g.narrow(both, -1, n if first else 0, n))
        if self.act == "silu" and self.chance(40):
            a = self.keep(g.mul(gate, self.keep(g.sigmoid(gate))))
        else:
            a = self.keep(g.activation(gate, self.act))
        y = self.keep(g.mul(*((a, up) if self.chance(70) else (up, a))))
        return self.dense(y, self.hidden)

    def _rope_tables(self):
        from .ir.ops.attention import rope_tables

        d = self.head_dim
        n_rot = d // 2 if self.rope == "partial" and d % 4 == 0 else d
        if isinstance(self.seq, int):
            cos, sin = rope_tables(self.seq, n_rot)
            return self.g.constant(cos), self.g.constant(sin)
        half = self.Shape((self.seq, n_rot // 2))
        return self.g.input("rope_cos", half), self.g.input("rope_sin", half)
