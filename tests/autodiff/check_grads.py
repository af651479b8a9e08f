"""`check_grads`: the one checker the autodiff tests share (JAX check_grads style). A graph is
built in float64 from a small builder function; reverse mode (grad_with_loss on a random
weighting of the outputs), forward mode (jvp along a random direction) and, at order 2, hvp are
compared with central finite differences through the reference interpreter."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

import braze as bz
from braze.autodiff import grad_with_loss, hvp, jvp

EPS = 1e-6


def build(fn: Callable, shapes: Sequence[tuple], name: str = "f") -> bz.Graph:
    """A graph with float64 inputs x0, x1, ... of `shapes` whose outputs are what `fn(g, *xs)`
    returns (a value or a tuple of values)."""
    g = bz.Graph(name)
    xs = [g.input(f"x{i}", bz.Shape(s, bz.f64)) for i, s in enumerate(shapes)]
    out = fn(g, *xs)
    g.set_outputs(list(out) if isinstance(out, (tuple, list)) else [out])
    return g


def random_feeds(shapes: Sequence[tuple], seed: int, domain: str = "real"
                 ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i, s in enumerate(shapes):
        x = rng.normal(size=s)
        if domain == "positive":
            x = np.abs(x) + 0.5
        elif domain == "unit":       # inside (-1, 1): asin, acos, atanh; tan away from poles
            x = np.tanh(x) * 0.8
        elif domain == "above_one":  # acosh
            x = np.abs(x) + 1.5
        feeds[f"x{i}"] = x
    return feeds


def weighted_loss(g: bz.Graph, seed: int) -> tuple[bz.Graph, list[np.ndarray]]:
    """A copy of `g` whose only output is sum_i <out_i, r_i> for fixed random r_i (float
    outputs): its gradient is the VJP of g with cotangents r_i."""
    from braze.autodiff.reverse import clone_into

    rng = np.random.default_rng(seed + 1000)
    b = bz.Graph(g.name + "_loss")
    vmap = clone_into(b, g)
    total, weights = None, []
    for v in g.outputs:
        shape = g.shape_of(v)
        if not shape.dtype.is_float:
            continue
        r = rng.normal(size=tuple(shape.dims))
        weights.append(r)
        term = b.sum(b.mul(vmap[v], b.constant(r, bz.f64)))
        total = term if total is None else b.add(total, term)
    b.set_outputs([total])
    return b, weights


def numeric_grad(f: Callable[[dict], float], feeds: dict, name: str, eps: float = EPS
                 ) -> np.ndarray:
    """Central finite differences of scalar f with respect to feeds[name], element by element."""
    x = feeds[name]
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        plus, minus = dict(feeds), dict(feeds)
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        plus[name], minus[name] = xp, xm
        out[idx] = (f(plus) - f(minus)) / (2 * eps)
    return out


def _run(g: bz.Graph, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return bz.interpret(g, feeds, float64=True)


def check_rev(g: bz.Graph, feeds: dict, wrt: Sequence[str], rtol: float, atol: float,
              seed: int = 0) -> None:
    loss, _ = weighted_loss(g, seed)
    grads = _run(grad_with_loss(loss, wrt), feeds)[1:]
    f = lambda fd: float(_run(loss, fd)[0])  # noqa: E731
    for name, got in zip(wrt, grads):
        want = numeric_grad(f, feeds, name)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol,
                                   err_msg=f"reverse-mode gradient of {g.name} wrt {name}")


def check_fwd(g: bz.Graph, feeds: dict, wrt: Sequence[str], rtol: float, atol: float,
              seed: int = 0) -> None:
    rng = np.random.default_rng(seed + 7)
    tangents = {f"tangent_{n}": rng.normal(size=feeds[n].shape) for n in wrt}
    outs = _run(jvp(g, wrt), {**feeds, **tangents})
    n_out = len(g.outputs)

    def shifted(t):
        fd = dict(feeds)
        for n in wrt:
            fd[n] = feeds[n] + t * tangents[f"tangent_{n}"]
        return _run(g, fd)

    plus, minus = shifted(EPS), shifted(-EPS)
    for i in range(n_out):
        if not np.issubdtype(plus[i].dtype, np.floating):
            continue
        want = (plus[i] - minus[i]) / (2 * EPS)
        np.testing.assert_allclose(outs[n_out + i], want, rtol=rtol, atol=atol,
                                   err_msg=f"forward-mode tangent of {g.name} output {i}")
        np.testing.assert_allclose(outs[i], plus[i] * 0.5 + minus[i] * 0.5, rtol=1e-5,
                                   atol=1e-5, err_msg="jvp primal output differs")


def check_hvp(g: bz.Graph, feeds: dict, wrt: Sequence[str], rtol: float, atol: float,
              seed: int = 0) -> None:
    """Order 2: hvp of the weighted loss against finite differences of its gradient."""
    loss, _ = weighted_loss(g, seed)
    rng = np.random.default_rng(seed + 11)
    vs = {f"tangent_{n}": rng.normal(size=feeds[n].shape) for n in wrt}
    got = _run(hvp(loss, wrt), {**feeds, **vs})
    grads = grad_with_loss(loss, wrt)

    def grad_at(t):
        fd = {**feeds}
        for n in wrt:
            fd[n] = feeds[n] + t * vs[f"tangent_{n}"]
        return _run(grads, fd)[1:]

    plus, minus = grad_at(EPS), grad_at(-EPS)
    for name, h, p, m in zip(wrt, got, plus, minus):
        np.testing.assert_allclose(h, (p - m) / (2 * EPS), rtol=rtol, atol=atol,
                                   err_msg=f"hvp of {g.name} wrt {name}")


def check_grads(fn: Callable, shapes: Sequence[tuple], *, order: int = 1,
                wrt: Sequence[int] | None = None, rtol: float = 1e-5, atol: float = 1e-6,
                domain: str = "real", seed: int = 0, name: str = "f") -> None:
    """Check reverse and forward mode of `fn` (a builder: fn(g, *xs)) at random float64 inputs
    of `shapes` against finite differences; order >= 2 also checks hvp. `wrt` lists the input
    positions to differentiate (default all)."""
    g = build(fn, shapes, name)
    feeds = random_feeds(shapes, seed, domain)
    names = [f"x{i}" for i in (range(len(shapes)) if wrt is None else wrt)]
    check_rev(g, feeds, names, rtol, atol, seed)
    check_fwd(g, feeds, names, rtol, atol, seed)
    if order >= 2:
        check_hvp(g, feeds, names, rtol * 10, atol * 10, seed)
