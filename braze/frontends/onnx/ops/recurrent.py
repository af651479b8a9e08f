"""ONNX LSTM, GRU and RNN: one braze loop per direction over a step body graph.

The input projection `X W^T + biases` is one matmul over every step, outside the loop; the step
carries the hidden state (and the LSTM cell), reads `R^T` (and peepholes) whole and the
projected input of its step, and returns the new state and `y_t`. A static sequence length
gives a `Scan` (reverse for the reverse direction, so Y rows stay in time order; bz.compile
unrolls it). A symbolic one gives a `While` whose step t reads row t of the projections and
writes row t of Y: correct for every length, but slower (each step rewrites Y); pass
input_shapes= to import_onnx to fix the length and get the Scan.

Every attribute is honoured: direction, layout, activations with activation_alpha /
activation_beta, clip, input_forget (LSTM) and linear_before_reset (GRU); and every input: B,
sequence_lens, initial_h, initial_c, P. sequence_lens (constant or computed) masks the steps
past each sequence's end: the state stops changing there and Y is 0, as in ONNX Runtime,
including the reverse direction (which starts at each sequence's last step) and length 0
(Y_h and Y_c are 0). Lengths known to be full everywhere add nothing.

Missing activation_alpha / activation_beta values take ONNX Runtime's defaults (LeakyRelu 0.01,
HardSigmoid 0.2 / 0.5, Elu 1.0, otherwise 0; the ONNX text's "defaults of the corresponding
operators" differ for ThresholdedRelu), each list consumed in order by the activations that use
it."""
from __future__ import annotations

from dataclasses import dataclass

from ....ir.dtypes import bool_, i64
from ....ir.graph import Graph
from ....ir.op import Value
from ....ir.shapes import Shape
from ....ir.symbolic import SymDim
from ..context import ImportContext, NodeView, converter
from .elementwise import elu_of, hard_sigmoid_of, softplus_of

# op type -> (gates, default activations per direction, state count)
_KINDS = {"LSTM": (4, ("Sigmoid", "Tanh", "Tanh"), 2), "GRU": (3, ("Sigmoid", "Tanh"), 1),
          "RNN": (1, ("Tanh",), 1)}
# activation -> (uses alpha, uses beta, default alpha, default beta), as ONNX Runtime reads them
_ACTIVATIONS = {
    "relu": (False, False, 0.0, 0.0), "tanh": (False, False, 0.0, 0.0),
    "sigmoid": (False, False, 0.0, 0.0), "affine": (True, True, 0.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0), "thresholdedrelu": (True, False, 0.0, 0.0),
    "scaledtanh": (True, True, 0.0, 0.0), "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0), "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
}
_DIRECTIONS = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}


@dataclass(frozen=True)
class Activation:
    """One of the recurrent activations, with its alpha and beta."""

    name: str
    alpha: float = 0.0
    beta: float = 0.0

    def __call__(self, g: Graph, x: Value) -> Value:
        n, a, b = self.name, self.alpha, self.beta
        if n in ("relu", "tanh", "sigmoid"):
            return g.activation(x, n)
        if n == "affine":
            return g.add(g.mul(x, a), b)
        if n == "leakyrelu":
            return g.where(g.ge(x, 0.0), x, g.mul(x, a))
        if n == "thresholdedrelu":
            return g.where(g.gt(x, a), x, 0.0)
        if n == "scaledtanh":
            return g.mul(g.tanh(g.mul(x, b)), a)
        if n == "hardsigmoid":
            return hard_sigmoid_of(g, x, a, b)
        if n == "elu":
            return elu_of(g, x, a)
        if n == "softsign":
            return g.div(x, g.add(g.abs(x), 1.0))
        return softplus_of(g, x)


@dataclass(frozen=True)
class Cell:
    """What one direction's step computes: the op kind and its attributes."""

    kind: str
    hidden: int
    acts: tuple[Activation, ...]
    clip: float | None
    input_forget: bool = False
    linear_before_reset: bool = False


@converter("LSTM", "GRU", "RNN")
def recurrent(ctx: ImportContext, node: NodeView):
    """Outputs (Y `[T, D, B, H]`, Y_h `[D, B, H]`[, Y_c]); batch first for layout 1."""
    g = ctx.g
    kind = node.op_type
    gates, _, n_state = _KINDS[kind]
    layout = int(node.attr("layout", 0))
    if layout not in (0, 1):
        raise ctx.fail(node, f"layout={layout} is not defined (0 or 1)")
    direction = node.attr("direction", "forward")
    if direction not in _DIRECTIONS:
        raise ctx.fail(node, f"direction={direction!r} is not defined (forward, reverse or "
                             "bidirectional)")
    reverses = _DIRECTIONS[direction]
    x = ctx.value(node, 0)
    if len(ctx.dims(x)) != 3:
        raise ctx.fail(node, f"X must have rank 3, got dims {ctx.dims(x)}")
    if layout:
        x = g.transpose(x, (1, 0, 2))
    steps, batch, width = ctx.dims(x)
    w, r = ctx.value(node, 1), ctx.value(node, 2)
    hidden = _hidden_size(ctx, node, w, r, gates, len(reverses), width)
    dt = ctx.dtype(x)
    if not dt.is_float:
        raise ctx.fail(node, f"{kind} needs float inputs, got {dt}")
    bias = ctx.opt_value(node, 3)
    _expect(ctx, node, bias, "B", (len(reverses), 2 * gates * hidden))
    lens = _sequence_mask(ctx, node, steps, batch)
    init = [_initial(ctx, node, 5 + i, layout, len(reverses), batch, hidden)
            for i in range(n_state)]
    peep = ctx.opt_value(node, 7) if kind == "LSTM" else None
    _expect(ctx, node, peep, "P", (len(reverses), 3 * hidden))
    acts = _activations(ctx, node, len(reverses))
    clip = node.attr("clip", None)
    want_y = bool(node.outputs) and node.outputs[0] != ""
    ys, finals = [], [[] for _ in range(n_state)]
    for d, rev in enumerate(reverses):
        c = Cell(kind, hidden, acts[d], None if clip is None else float(clip),
                 bool(node.attr("input_forget", 0)), bool(node.attr("linear_before_reset", 0)))
        wd, rd = _direction(g, w, d), _direction(g, r, d)
        bd = None if bias is None else _direction(g, bias, d)
        pd = None if peep is None else _direction(g, peep, d)
        states = [s[d] for s in init]
        y, last = _run_direction(g, c, x, wd, rd, bd, pd, states, lens, rev, want_y,
                                 f"{node.name or kind}_d{d}")
        ys.append(y)
        for i, s in enumerate(last):
            finals[i].append(s)
    outs = []
    if want_y:
        y = _stack(g, ys, 1)  # [T, D, B, H]
        outs.append(g.transpose(y, (2, 0, 1, 3)) if layout else y)
    else:
        outs.append(None)
    for states in finals:
        s = _stack(g, states, 0)  # [D, B, H]
        outs.append(g.transpose(s, (1, 0, 2)) if layout else s)
    return outs[:max(len(node.outputs), 1)]


def _stack(g: Graph, vs: list[Value], axis: int) -> Value:
    parts = [g.unsqueeze(v, axis) for v in vs]
    return parts[0] if len(parts) == 1 else g.concat(parts, axis)


def _hidden_size(ctx, node, w, r, gates: int, dirs: int, width) -> int:
    hidden = node.attr("hidden_size", None)
    wd = ctx.dims(w)
    if hidden is None:
        if len(wd) != 3 or not isinstance(wd[1], int) or wd[1] % gates:
            raise ctx.fail(node, f"no hidden_size attribute and W's dims {wd} do not give it")
        hidden = wd[1] // gates
    hidden = int(hidden)
    _expect(ctx, node, w, "W", (dirs, gates * hidden, width))
    _expect(ctx, node, r, "R", (dirs, gates * hidden, hidden))
    return hidden


def _expect(ctx, node, v, what: str, dims: tuple) -> None:
    if v is not None and tuple(ctx.dims(v)) != dims:
        raise ctx.fail(node, f"{what} must have dims {dims}, got {tuple(ctx.dims(v))}")


def _direction(g: Graph, v: Value, d: int) -> Value:
    """Row `d` of a per-direction tensor, without its leading axis."""
    dims = g.shape_of(v).dims
    if dims[0] != 1:
        v = g.narrow(v, 0, d, 1)
    return g.reshape(v, dims[1:])


def _initial(ctx, node, i: int, layout: int, dirs: int, batch, hidden: int) -> list[Value]:
    """Per direction, the initial state `[batch, hidden]` (zeros when input `i` is absent)."""
    g = ctx.g
    if not ctx.has(node, i):
        zero = g.expand(g.constant(0.0, ctx.dtype(ctx.value(node, 0))), (batch, hidden))
        return [zero] * dirs
    v = ctx.value(node, i)
    what = "initial_h" if i == 5 else "initial_c"
    if layout:
        _expect(ctx, node, v, what, (batch, dirs, hidden))
        v = g.transpose(v, (1, 0, 2))
    _expect(ctx, node, v, what, (dirs, batch, hidden))
    return [_direction(g, v, d) for d in range(dirs)]


def _sequence_mask(ctx, node, steps: int, batch) -> Value | None:
    """`[T, B, 1]` bool, true where step t is inside sequence b, or None when every sequence
    is known to be full length (or sequence_lens is absent)."""
    if not ctx.has(node, 4):
        return None
    k = ctx.known(node, 4)
    dims = tuple(k.array.shape) if k is not None else tuple(ctx.dims(ctx.value(node, 4)))
    if dims != (batch,):
        raise ctx.fail(node, f"sequence_lens must have dims ({batch},), got {dims}")
    if k is not None and not k.symbolic and (k.array.reshape(-1) == steps).all():
        return None
    g = ctx.g
    lens = ctx.value(node, 4)
    t = g.reshape(g.arange(steps, 0, 1, ctx.dtype(lens)), (steps, 1, 1))
    return g.lt(t, g.reshape(lens, (1, batch, 1)))


def _activations(ctx, node, dirs: int) -> list[tuple[Activation, ...]]:
    """Per direction, the activations with their alpha / beta (ONNX Runtime's reading)."""
    default = _KINDS[node.op_type][1]
    names = [str(n) for n in node.attr("activations", default * dirs)]
    if len(names) != len(default) * dirs:
        raise ctx.fail(node, f"{len(names)} activations given; {node.op_type} takes "
                             f"{len(default)} per direction ({len(default) * dirs} in all)")
    alphas = list(node.attr("activation_alpha", []))
    betas = list(node.attr("activation_beta", []))
    acts = []
    for n in names:
        key = n.lower()
        if key not in _ACTIVATIONS:
            raise ctx.fail(node, f"activation {n!r} is not one of ONNX's recurrent activations "
                                 f"({', '.join(sorted(_ACTIVATIONS))})")
        uses_a, uses_b, da, db = _ACTIVATIONS[key]
        a = float(alphas.pop(0)) if uses_a and alphas else da
        b = float(betas.pop(0)) if uses_b and betas else db
        acts.append(Activation(key, a, b))
    per = len(default)
    return [tuple(acts[d * per:(d + 1) * per]) for d in range(dirs)]


# -- one direction ----------------------------------------------------------------------------
def _run_direction(g: Graph, cell: Cell, x, w, r, b, p, states: list[Value], mask,
                   reverse: bool, want_y: bool, name: str) -> tuple[Value | None, list[Value]]:
    """(Y `[T, B, H]` or None, final states) of one direction: a Scan over a static sequence
    length, a While over a symbolic one."""
    steps, batch, _ = g.shape_of(x).dims
    h, gh = cell.hidden, g.shape_of(w).dims[0]
    proj = g.matmul(x, g.transpose(w, (1, 0)))  # [T, B, gates * H], every step at once
    reads = {"r_t": g.transpose(r, (1, 0))}  # [H, gates * H]
    if p is not None:
        reads["p"] = p
    if b is not None:
        wb, rb = g.narrow(b, 0, 0, gh), g.narrow(b, 0, gh, gh)
        if cell.kind == "GRU" and cell.linear_before_reset:  # r * (h R_h^T + Rb_h): in the step
            reads["rb_h"] = g.narrow(rb, 0, 2 * h, h)
            rb = g.pad(g.narrow(rb, 0, 0, 2 * h), [(0, h)])
        proj = g.add(proj, g.add(wb, rb))
    run = _scan if isinstance(steps, int) else _while
    y, finals = run(g, cell, proj, reads, states, mask, reverse, want_y, name)
    if mask is not None:  # a sequence of length 0 ends with zero states, as in ONNX Runtime
        started = g.reshape(g.narrow(mask, 0, 0, 1), (batch, 1))
        finals = [g.where(started, s, 0.0) for s in finals]
    return y, finals


def _scan(g: Graph, cell: Cell, proj, reads: dict, states: list[Value], mask, reverse: bool,
          want_y: bool, name: str):
    """The loop over a static sequence length: carries the states, reads `reads` whole and
    row t of the projections (and of the mask)."""
    steps, batch, _ = g.shape_of(proj).dims
    b = Graph(f"{name}_step", record_provenance=False)
    carries = _state_inputs(b, cell, g.shape_of(states[0]))
    inner = {k: b.input(k, g.shape_of(v)) for k, v in reads.items()}
    proj_t = b.input("proj_t", Shape(g.shape_of(proj).dims[1:], g.shape_of(proj).dtype))
    valid_t = b.input("valid_t", Shape((batch, 1), bool_)) if mask is not None else None
    new, y_t = _step(b, cell, carries, inner, proj_t, valid_t)
    b.set_outputs(new + ([y_t] if want_y else []))
    xs = [proj] + ([mask] if mask is not None else [])
    outs = g.scan_general(b, states, steps, bcasts=list(reads.values()), xs=xs,
                          reverse=reverse)
    n = len(states)
    return (outs[n] if want_y else None), list(outs[:n])


def _while(g: Graph, cell: Cell, proj, reads: dict, states: list[Value], mask, reverse: bool,
           want_y: bool, name: str):
    """The loop over a symbolic sequence length: carried (t, states, Y so far, and the
    loop-invariant inputs); step t reads row t of the projections and writes row t of Y."""
    steps, batch, _ = g.shape_of(proj).dims
    dt = g.shape_of(proj).dtype
    n = len(states)
    last = (SymDim.of(steps) - 1).to_dim()
    start = g.sym_const((last,), (), i64) if reverse else g.constant(0, i64)
    y0 = g.expand(g.constant(0.0, dt), (steps, batch, cell.hidden))
    carried = [start, *states, y0, proj, *reads.values()] + ([mask] if mask is not None else [])
    types = [g.shape_of(v) for v in carried]
    names = ["t", "h", "c"][:n + 1] + ["y", "proj"] + list(reads) + \
        (["valid"] if mask is not None else [])

    cond = Graph(f"{name}_more", record_provenance=False)
    c_in = [cond.input(k, s) for k, s in zip(names, types)]
    cond.set_outputs([cond.ge(c_in[0], 0) if reverse else
                      cond.lt(c_in[0], cond.sym_const((steps,), (), i64))])

    b = Graph(f"{name}_step", record_provenance=False)
    ins = dict(zip(names, (b.input(k, s) for k, s in zip(names, types))))
    t = ins["t"]
    valid_t = b.gather(ins["valid"], t, 0) if mask is not None else None
    carries = [ins[k] for k in names[1:n + 1]]
    new, y_t = _step(b, cell, carries, {k: ins[k] for k in reads}, b.gather(ins["proj"], t, 0),
                     valid_t)
    rows = b.reshape(b.arange(steps, 0, 1, i64), (steps, 1, 1))
    y = b.where(b.eq(rows, t), b.unsqueeze(y_t, 0), ins["y"]) if want_y else ins["y"]
    b.set_outputs([b.add(t, -1 if reverse else 1), *new, y] +
                  [ins[k] for k in names[n + 2:]])
    outs = g.while_loop(cond, b, *carried)
    return (outs[n + 1] if want_y else None), list(outs[1:n + 1])


def _state_inputs(b: Graph, cell: Cell, state: Shape) -> list[Value]:
    return [b.input("h", state)] + ([b.input("c", state)] if cell.kind == "LSTM" else [])


def _step(b: Graph, cell: Cell, carries, reads, proj_t, valid_t) -> tuple[list[Value], Value]:
    """(new states, y_t) of one step; past a sequence's end (valid_t false) the states keep
    their values and y_t is 0."""
    new = _STEPS[cell.kind](b, cell, carries, reads, proj_t)
    if valid_t is None:
        return new, new[0]
    new = [b.where(valid_t, v, old) for v, old in zip(new, carries)]
    return new, b.where(valid_t, new[0], 0.0)


def _gate(b: Graph, v: Value, i: int, h: int) -> Value:
    return b.narrow(v, 1, i * h, h)


def _clip(b: Graph, cell: Cell, v: Value) -> Value:
    return v if cell.clip is None else b.clamp(v, -cell.clip, cell.clip)


def _lstm_step(b: Graph, cell: Cell, carries, reads, proj) -> list[Value]:
    """ONNX's LSTM equations, gates in i, o, f, c order; peepholes P = [Pi, Po, Pf]."""
    h_prev, c_prev = carries
    f_act, g_act, h_act = cell.acts
    h = cell.hidden
    z = b.add(proj, b.matmul(h_prev, reads["r_t"]))
    p = reads.get("p")
    pi, po, pf = (None,) * 3 if p is None else (b.narrow(p, 0, k * h, h) for k in range(3))

    def pre(k, peep, c):
        v = _gate(b, z, k, h)
        return _clip(b, cell, v if peep is None else b.add(v, b.mul(peep, c)))

    i = f_act(b, pre(0, pi, c_prev))
    f = b.sub(1.0, i) if cell.input_forget else f_act(b, pre(2, pf, c_prev))
    c = b.add(b.mul(f, c_prev), b.mul(i, g_act(b, pre(3, None, None))))
    o = f_act(b, pre(1, po, c))
    return [b.mul(o, h_act(b, c)), c]


def _gru_step(b: Graph, cell: Cell, carries, reads, proj) -> list[Value]:
    """ONNX's GRU equations, gates in z, r, h order."""
    (h_prev,) = carries
    f_act, g_act = cell.acts
    h = cell.hidden
    r_t = reads["r_t"]
    if cell.linear_before_reset:
        rec = b.matmul(h_prev, r_t)
        zr = b.add(b.narrow(proj, 1, 0, 2 * h), b.narrow(rec, 1, 0, 2 * h))
    else:
        zr = b.add(b.narrow(proj, 1, 0, 2 * h), b.matmul(h_prev, b.narrow(r_t, 1, 0, 2 * h)))
    z = f_act(b, _clip(b, cell, _gate(b, zr, 0, h)))
    r = f_act(b, _clip(b, cell, _gate(b, zr, 1, h)))
    if cell.linear_before_reset:
        lin = _gate(b, rec, 2, h)
        if "rb_h" in reads:
            lin = b.add(lin, reads["rb_h"])
        cand = b.add(_gate(b, proj, 2, h), b.mul(r, lin))
    else:
        cand = b.add(_gate(b, proj, 2, h), b.matmul(b.mul(r, h_prev), b.narrow(r_t, 1, 2 * h, h)))
    hh = g_act(b, _clip(b, cell, cand))
    return [b.add(b.mul(b.sub(1.0, z), hh), b.mul(z, h_prev))]


def _rnn_step(b: Graph, cell: Cell, carries, reads, proj) -> list[Value]:
    """ONNX's RNN equation: H = f(X W^T + H_prev R^T + Wb + Rb)."""
    (h_prev,) = carries
    return [cell.acts[0](b, _clip(b, cell, b.add(proj, b.matmul(h_prev, reads["r_t"]))))]


_STEPS = {"LSTM": _lstm_step, "GRU": _gru_step, "RNN": _rnn_step}
