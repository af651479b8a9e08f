"""A program: one graph planned for one binding of its symbolic dims. Static values (weights and
everything computed only from weights and dims) are computed once here; every other node is a
step (kernel, argument slots) over arrays that are views of one preallocated arena. Every feed
has a planned arena buffer too, so every step's arguments are fixed when the program is built:
each step is bound once to a zero-argument call (the kernel's own `bind`, precomputing pointers
and views, or the kernel's `run` over its fixed arrays), and running is a flat loop of those
calls that does no planning, allocation or lookup. A GEMM on a static weight whose product only
a fused_swiglu reads (and no output is) runs with it as one step when fused.gated_gemm takes
the pair: the gated product comes out of the GEMM's epilogue, the product gets no buffer.
Likewise, under the bf16 policy, a GEMM or gated MLP whose f32 result only the rounding for the
next GEMM reads writes that rounding itself when fused.rounded_output takes the pair (the bf16
hand-off): the next GEMM reads the bf16 values (KernelContext.handoff), nothing is rounded
twice and the f32 result gets no buffer. A conv before convs does the same where
conv.rounded_output takes it (an NHWC result, nhwc_io.rounds_in_store).

A feed that the steps only read (no step writes its buffer in place, no output is it or a view
of it) is not copied in when the caller's array can stand in for the buffer: C-contiguous,
aligned to its element size and outside the arena (an earlier `copy=False` output is copied).
Then the few steps that read it, and the views of it they read, are re-bound to the caller's
array for that call only (`Program.bound_calls`: the call's bindings are its own, the program
is not changed); any other feed is copied into its buffer. Copying two 64 MiB feeds cost 18-21
ms per call on the dev VM."""
from __future__ import annotations

import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from ..errors import InterpretError
from ..ir.analysis import weight_prep_nodes
from ..ir.dtypes import bf16, f32
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Value
from ..ir.ops.conv import Conv2d
from ..ir.ops.elementwise import Cast
from ..ir.ops.fused_simple import FusedConvBiasAct, FusedMatMulBiasAct, FusedSwiGLU
from ..ir.ops.io import Constant, Input, Param
from ..ir.ops.linalg import MatMul
from ..ir.ops.shape import Expand, Narrow, Reshape
from ..ir.shapes import Shape
from ..ir.symbolic import eval_dim
from .codegen.builds import BuildLimits, build_all
from .kernels import Kernel, KernelContext, conv, has_empty, kernel_for, reference_kernel
from .kernels.fused import gated_gemm, rounded_output
from .kernels.registry import Preparations, libraries_for
from .layout import plan_channels_last
from .plan import Buffer, MemoryPlan, SharedArena, aligned_arena, plan_memory

__all__ = ["Program", "Step", "DirectFeeds", "build_program"]

_VIEW_OPS = (Reshape, Narrow, Expand)
_PREPARED = "kernel preparations"  # static_cache entry: KernelContext.prepared


@dataclass
class Step:
    """One kernel call: `kernel.run(*[env[s] for s in slots])` (inputs, then outputs), bound
    once as `call()` over the program's fixed arrays. `into`, when set, is a node whose work
    the kernel does too, in its epilogue (a gated MLP after its GEMM): the step reads `node`'s
    inputs and writes `into`'s outputs, and `node`'s own output has no buffer."""

    node: Node
    kernel: Kernel
    slots: tuple[int, ...]
    call: Callable[[], None] | None = None
    into: Node | None = None
    inputs: tuple[Value, ...] = ()  # what it reads: node.inputs, with Kernel.reads applied
    absorbs: tuple[Node, ...] = ()  # every node done in the epilogue (`into` last)

    @property
    def writes(self) -> tuple[Value, ...]:
        return (self.into or self.node).values


@dataclass
class Program:
    graph: Graph
    symbols: dict[str, int]
    env: list                      # per slot: its array (arena view, feed buffer or static)
    input_slots: dict[str, int]
    steps: list[Step]
    output_slots: list[int]
    plan: MemoryPlan
    static_ids: set[int]          # nodes computed once (weights, dims)
    view_ids: set[int]            # nodes that are views of their input
    arena: np.ndarray
    direct: DirectFeeds = field(default_factory=lambda: DirectFeeds((), (), ()))

    def __post_init__(self) -> None:
        self.feed_buffers = tuple((name, self.env[s]) for name, s in self.input_slots.items())
        self.calls = tuple(s.call for s in self.steps)
        self.outputs = tuple(self.env[s] for s in self.output_slots)

    def load(self, feeds: Mapping[str, np.ndarray], skip: Container[str] = ()) -> None:
        """Copy the feeds (already checked: dtypes and shapes of this binding) into their
        buffers, but those named in `skip`. A feed that is itself a view of the arena (an
        earlier copy=False output) is snapshotted first, so loading one feed never overwrites
        another."""
        todo = [(name, dst) for name, dst in self.feed_buffers if name not in skip]
        arena = self.arena
        if any(np.may_share_memory(feeds[name], arena) for name, _ in todo):
            feeds = {name: np.array(feeds[name]) for name, _ in todo}
        for name, dst in todo:
            np.copyto(dst, feeds[name])

    def bound_calls(self, feeds: Mapping[str, np.ndarray]) -> Sequence[Callable[[], None]]:
        """Load `feeds` and return the step calls that run on them: the calls bound at build
        time, but for the steps reading a feed bound directly (see the module docstring)."""
        direct, arena = self.direct, self.arena
        bound: dict[int, np.ndarray] = {}
        names = []
        for name, s in direct.feeds:
            arr = feeds[name]
            flags = arr.flags
            if flags.c_contiguous and flags.aligned and not np.may_share_memory(arr, arena):
                bound[s] = arr
                names.append(name)
        self.load(feeds, names)
        if not bound:
            return self.calls
        for s, fn, src in direct.views:
            if src in bound:
                bound[s] = fn(bound[src])
        calls = list(self.calls)
        env, steps = self.env, self.steps
        for i in direct.steps:
            slots = steps[i].slots
            if any(s in bound for s in slots):
                calls[i] = _bind(steps[i].kernel, tuple(bound.get(s, env[s]) for s in slots))
        return calls

    def run(self, feeds: Mapping[str, np.ndarray], copy: bool = True) -> list[np.ndarray]:
        """The outputs for `feeds`; with `copy=False` they are views of the arena (and of
        static values), valid until the next run of any program sharing the arena. Never views
        of a feed: an output that would be one has its feed copied into the arena."""
        calls = self.bound_calls(feeds)
        done = 0
        try:
            for call in calls:
                call()
                done += 1
        except InterpretError:
            raise
        except Exception as e:  # name the step's node and keep the cause, as interpret does
            raise self._step_error(done, e) from e
        if copy:
            return [out.copy() for out in self.outputs]
        return [_read_only(out) for out in self.outputs]

    def _step_error(self, index: int, error: Exception) -> InterpretError:
        """What a failed step raises: the node it runs, where it came from, the cause (an index
        out of range in a gather, a kernel refusing its arrays)."""
        node = self.steps[index].node
        where = f" from {node.provenance}" if node.provenance else ""
        return InterpretError(f"while running node {node.label}{where} compiled: "
                              f"{type(error).__name__}: {error}")

    def profile(self, feeds: Mapping[str, np.ndarray]) -> list[tuple[Step, float]]:
        """Run once, timing every step's bound call."""
        clock = time.perf_counter
        times = []
        for step, call in zip(self.steps, self.bound_calls(feeds), strict=True):
            t0 = clock()
            call()
            times.append((step, clock() - t0))
        return times


def _read_only(a: np.ndarray) -> np.ndarray:
    """A view of `a` that cannot be written: a copy=False output may be a stored weight (a
    param returned as an output) or a static value; writing it would change the model."""
    v = a.view()
    v.flags.writeable = False
    return v


@dataclass(frozen=True)
class DirectFeeds:
    """The feeds a call may bind directly (name, slot), the views of them as (slot, view
    function, source slot) in the order they are made, and the steps that read either."""

    feeds: tuple[tuple[str, int], ...]
    views: tuple[tuple[int, Callable, int], ...]
    steps: tuple[int, ...]


@dataclass(frozen=True)
class _Scratch:
    """A kernel's temporary buffer: node id and index."""

    node: int
    index: int

    def __str__(self) -> str:
        return f"scratch %{self.node}.{self.index}"


def concrete(shape: Shape, symbols: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(eval_dim(d, symbols) for d in shape.dims)


def _static_nodes(g: Graph) -> list[bool]:
    """Sources other than inputs, and the weight-preparation nodes computed from them."""
    prep = weight_prep_nodes(g)
    return [n.id in prep or (n.op.source and not isinstance(n.op, Input)) for n in g.nodes]


def _view_fn(node: Node, out_dims: tuple[int, ...]):
    op = node.op
    if isinstance(op, Reshape):
        return lambda x: x.reshape(out_dims)
    if isinstance(op, Expand):
        return lambda x: np.broadcast_to(x, out_dims)
    ax, start, length = op.axis, op.start, out_dims[op.axis]
    idx = tuple([slice(None)] * ax + [slice(start, start + length)])
    return lambda x: x[idx]


def build_program(g: Graph, symbols: Mapping[str, int], weights: Mapping[str, np.ndarray],
                  ctx: KernelContext, static_cache: dict, shared_arena: SharedArena | None = None,
                  channels_last: bool = True) -> Program:
    """Plan `g` for `symbols`: evaluate static values, pick a kernel per node, plan memory.
    With `shared_arena`, the arena is the front of that buffer instead of a new one. With
    `channels_last`, convs' activations are kept NHWC where layout.plan_channels_last says;
    should a step touching one run a kernel that does not take NHWC, the program is built
    again all NCHW."""
    symbols = dict(symbols)
    slot_of: dict[Value, int] = {}
    env: list = []

    def slot(v: Value) -> int:
        if v not in slot_of:
            slot_of[v] = len(env)
            env.append(None)
        return slot_of[v]

    static = _static_nodes(g)
    needed = _needed_static(g, static)
    shapes = {v: concrete(g.shape_of(v), symbols) for n in g.nodes for v in n.values}
    static_ids = set()
    for n in g.nodes:
        if static[n.id] and n.id in needed:
            for v, arr in zip(n.values, _static_value(n, g, weights, symbols, env, slot_of,
                                                      static_cache), strict=True):
                env[slot(v)] = arr
            static_ids.add(n.id)
    input_slots = {n.op.name: slot(n.value) for n in g.inputs}
    binds = frozenset(v for n in g.nodes if n.id in static_ids and _binds(n, g, static_cache)
                      for v in n.values)  # their preparations are this binding's own
    ctx = replace(ctx, static={v: env[i] for v, i in slot_of.items() if env[i] is not None},
                  prepared=Preparations(static_cache.setdefault(_PREPARED, {}), binds),
                  rounded=_rounded(g) if ctx.precision is not None else {}, handoff={})

    def types(n: Node) -> tuple[list[Shape], list[Shape]]:
        return ([Shape(shapes[v], g.shape_of(v).dtype) for v in n.inputs],
                [Shape(shapes[v], s.dtype) for v, s in zip(n.values, n.outputs)])

    if channels_last:
        ctx = replace(ctx, channels_last=plan_channels_last(g, static, types, ctx))
    ctx = replace(ctx, unbuilt=_build_libraries(g, static, types, ctx))
    steps: list[Step] = []
    views: list = []                  # (slot, view fn, source slot), made once after the plan
    view_ids: set[int] = set()
    contiguous: dict[Value, bool] = {}  # views of contiguous memory that stay contiguous
    scratch_types: dict = {}
    last_use: dict[Value, int] = {}   # buffer value -> last step index reading it
    alias: dict[Value, Value] = {}    # view value -> the buffer value it looks into
    epilogues = _gated_epilogues(g, static)
    roundings = _rounding_epilogues(g, static) if ctx.rounded else {}
    absorbed: set[int] = set()        # nodes run in an earlier step's epilogue
    for n in g.nodes:
        if static[n.id] or isinstance(n.op, Input) or n.id in absorbed:
            continue
        in_shapes, out_shapes = types(n)
        src = n.inputs[0] if n.inputs else None
        view_ok, contig = _view_layout(n, shapes, contiguous.get(src, True))
        if view_ok:  # reshape / narrow / expand: NumPy views, no step
            fn = _view_fn(n, shapes[n.value])
            root = alias.get(src, src)
            alias[n.value] = root
            contiguous[n.value] = contig
            view_ids.add(n.id)
            views.append((slot(n.value), fn, slot(src)))
            continue
        if has_empty(in_shapes, out_shapes):  # no fused epilogue: the reference runs it
            k, absorbs = None, ()
        else:
            k, absorbs = _epilogue_kernel(g, n, in_shapes, shapes, epilogues, roundings, ctx)
        into = absorbs[-1] if absorbs else None
        if k is None:
            k = kernel_for(n, in_shapes, out_shapes, ctx) or reference_kernel(n, symbols)
        absorbed.update(a.id for a in absorbs)
        writes = (into or n).values
        reads = list(n.inputs)
        for pos, v in k.reads:
            reads[pos] = v
        scratch = []
        for i, (dims, dt) in enumerate(k.scratch):
            key = _Scratch(n.id, i)
            shapes[key] = tuple(int(d) for d in dims)
            scratch_types[key] = np.dtype(dt)
            scratch.append(slot(key))
        steps.append(Step(n, k, tuple(slot(v) for v in reads) +
                          tuple(slot(v) for v in writes) + tuple(scratch), into=into,
                          inputs=tuple(reads), absorbs=absorbs))
    outputs = {alias.get(v, v) for v in g.outputs}
    if any(st.kernel.reads for st in steps):
        steps, views = _drop_unread(steps, views, outputs, alias, slot_of)
    if ctx.channels_last and not _layouts_hold(steps, ctx.channels_last):
        return build_program(g, symbols, weights, replace(ctx, channels_last=frozenset()),
                             static_cache, shared_arena, False)
    for idx, step in enumerate(steps):
        for v in step.inputs:
            last_use[alias.get(v, v)] = idx
    end = len(steps)
    for v in outputs:
        last_use[v] = end
    buffers = _buffers(g, steps, last_use, shapes, outputs, alias)
    for idx, step in enumerate(steps):
        for i, (_, dt) in enumerate(step.kernel.scratch):
            key = _Scratch(step.node.id, i)
            nbytes = int(np.prod(shapes[key], dtype=np.int64)) * np.dtype(dt).itemsize
            buffers.append(Buffer(key, nbytes, idx, idx))
    for n in g.inputs:  # feeds are copied in before the first step
        v = n.value
        nbytes = int(np.prod(shapes[v], dtype=np.int64)) * g.shape_of(v).dtype.itemsize
        buffers.append(Buffer(v, nbytes, 0, last_use.get(v, 0)))
    plan = plan_memory(buffers)
    arena = (shared_arena.take(plan.peak) if shared_arena is not None
             else aligned_arena(plan.peak))
    for b in plan.buffers:
        for v in (b.key, *b.shares):
            dims = shapes[v]
            dt = scratch_types[v] if isinstance(v, _Scratch) else g.shape_of(v).dtype.np
            size = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
            env[slot(v)] = arena[b.offset:b.offset + size].view(dt).reshape(dims)
    for s, fn, src in views:  # views of arena buffers and static values never move
        env[s] = fn(env[src])
    for step in steps:
        step.call = _bind(step.kernel, tuple(env[s] for s in step.slots))
    for v in g.outputs:
        slot(v)
    direct = _direct_feeds(g, plan, outputs, alias, slot_of, views, steps)
    return Program(g, symbols, env, input_slots, steps,
                   [slot_of[v] for v in g.outputs], plan, static_ids, view_ids, arena, direct)


def _build_libraries(g: Graph, static: list[bool], types: Callable, ctx: KernelContext
                     ) -> dict[str, str | None]:
    """Build the generated C libraries the steps' kernels will load, in parallel and within
    ctx.build_limits (codegen.builds); library key -> why it was not built (None: failed)."""
    libraries = []
    for n in g.nodes:
        if not (static[n.id] or isinstance(n.op, Input)):
            libraries += libraries_for(n, *types(n), ctx)
    return build_all(libraries, ctx.build_limits or BuildLimits())


def _layouts_hold(steps: Sequence[Step], nhwc: frozenset) -> bool:
    """Whether every step reading or writing a value kept NHWC takes that layout."""
    return all(st.kernel.channels_last for st in steps
               if any(v in nhwc for v in (*st.inputs, *st.writes)))


def _rounded(g: Graph) -> dict[Value, Value]:
    """Each value computed as cast(cast(a, bf16), f32) from an f32 `a` (the precision policy's
    rounding of an operand) -> `a` (see KernelContext.rounded)."""
    out = {}
    for n in g.nodes:
        if not isinstance(n.op, Cast) or n.op.dtype != f32:
            continue
        inner = g.nodes[n.inputs[0].node]
        if isinstance(inner.op, Cast) and inner.op.dtype == bf16 and \
                g.shape_of(inner.inputs[0]).dtype == f32:
            out[n.value] = inner.inputs[0]
    return out


def _drop_unread(steps: list[Step], views: list, outputs: set[Value], alias: dict,
                 slot_of: dict) -> tuple[list[Step], list]:
    """The steps (and views) whose results something reads: after kernels read other values
    than their nodes' inputs (`Kernel.reads`), the steps computing what they no longer read
    (a bf16 GEMM's operand rounding) are left out."""
    live = set(outputs)
    kept: list[Step] = []
    for step in reversed(steps):
        if any(alias.get(v, v) in live or v in live for v in step.writes):
            kept.append(step)
            live.update(alias.get(v, v) for v in step.inputs)
            live.update(step.inputs)
    kept.reverse()
    by_slot = {s: v for v, s in slot_of.items()}
    views = [vw for vw in views if alias.get(by_slot[vw[0]], by_slot[vw[0]]) in live or
             by_slot[vw[0]] in live]
    return kept, views


def _gated_epilogues(g: Graph, static: list[bool]) -> dict[int, Node]:
    """GEMM node id -> the FusedSwiGLU node that is the only reader of its product, where the
    product is no graph output: the two may run as one step (fused.gated_gemm decides)."""
    out = {}
    for n in g.nodes:
        if not isinstance(n.op, FusedSwiGLU) or static[n.id]:
            continue
        h = n.inputs[0]
        gemm = g.nodes[h.node]
        if (isinstance(gemm.op, (MatMul, FusedMatMulBiasAct)) and not static[gemm.id] and
                len(g.users(h)) == 1 and not g.is_output(h)):
            out[gemm.id] = n
    return out


def _epilogue_kernel(g: Graph, n: Node, in_shapes: list[Shape], shapes: dict,
                     gated: dict[int, Node], roundings: dict[int, Node], ctx: KernelContext
                     ) -> tuple[Kernel | None, tuple[Node, ...]]:
    """A kernel doing `n` and the nodes after it in its epilogue, and those nodes (the last
    is the one whose outputs the step writes); (None, ()) when none takes them. Tried in
    order: a GEMM with its gated MLP and that MLP's rounding for the next GEMM; the GEMM with
    its gated MLP; `n` with its rounding for the next GEMM (see the module docstring)."""
    def types(node: Node, dtype=None) -> list[Shape]:
        return [Shape(shapes[v], dtype or s.dtype) for v, s in zip(node.values, node.outputs)]

    tries = []
    mlp = gated.get(n.id)
    if mlp is not None:
        if mlp.id in roundings:
            tries.append((gated_gemm, (mlp, roundings[mlp.id]), bf16))
        tries.append((gated_gemm, (mlp,), None))
    if n.id in roundings:
        make = conv.rounded_output if isinstance(n.op, _CONVS) else rounded_output
        tries.append((make, (roundings[n.id],), bf16))
    for make, absorbs, dtype in tries:
        k = make(n, absorbs[0], in_shapes, types(absorbs[-1], dtype), ctx)
        if k is not None:
            if dtype is not None:
                _hand_over(g, absorbs[-1], ctx)
            return k, absorbs
    return None, ()


_CONVS = (Conv2d, FusedConvBiasAct)


def _rounding_epilogues(g: Graph, static: list[bool]) -> dict[int, Node]:
    """Node id (a GEMM, a gated MLP's act(gate) * up, or a conv) -> the cast to bf16 that is
    the only reader of its f32 result, where the result is no graph output (the bf16 policy's
    rounding of the next GEMM's or convs' operand): the two may run as one step writing the
    bf16 values (fused.rounded_output, conv.rounded_output decide)."""
    out = {}
    for n in g.nodes:
        if not isinstance(n.op, Cast) or n.op.dtype != bf16 or static[n.id]:
            continue
        h = n.inputs[0]
        src = g.nodes[h.node]
        if (isinstance(src.op, (MatMul, FusedMatMulBiasAct, FusedSwiGLU, *_CONVS)) and
                not static[src.id] and g.shape_of(h).dtype == f32 and
                len(g.users(h)) == 1 and not g.is_output(h)):
            out[src.id] = n
    return out


def _hand_over(g: Graph, cast: Node, ctx: KernelContext) -> None:
    """`cast`'s bf16 values are written by the GEMM before it (its f32 product gets no
    buffer): a later cast(them, f32) is now known as the rounding of those bf16 values
    (KernelContext.handoff) instead of the product's (KernelContext.rounded)."""
    for user in g.users(cast.value):
        if isinstance(user.op, Cast) and user.op.dtype == f32:
            ctx.rounded.pop(user.value, None)
            ctx.handoff[user.value] = cast.value


def _direct_feeds(g: Graph, plan: MemoryPlan, outputs: set, alias: dict, slot_of: dict,
                  views: list, steps: list[Step]) -> DirectFeeds:
    """The feeds that steps only read: no step writes into the feed's buffer in place (the
    plan shares no buffer of an input) and no output is the feed or a view of it."""
    shared = {v for b in plan.buffers if b.shares for v in (b.key, *b.shares)}
    feeds = tuple((n.op.name, slot_of[n.value]) for n in g.inputs
                  if n.value not in outputs and n.value not in shared)
    roots = {s for _, s in feeds}
    root_of = {slot_of[v]: slot_of[r] for v, r in alias.items()}
    dependent = {s for s, _, _ in views if root_of.get(s) in roots}
    reads = roots | dependent
    return DirectFeeds(feeds, tuple(vw for vw in views if vw[0] in dependent),
                       tuple(i for i, st in enumerate(steps) if reads.intersection(st.slots)))


def _bind(kernel: Kernel, args: tuple) -> Callable[[], None]:
    """The step as a zero-argument call over its fixed arrays."""
    if kernel.bind is not None:
        return kernel.bind(*args)
    return partial(kernel.run, *args)


def _view_layout(n: Node, shapes, src_contiguous: bool) -> tuple[bool, bool]:
    """(runs as a view, the view is C-contiguous). A reshape is a view only of contiguous
    memory (NumPy would silently copy otherwise, and a copy made once would go stale); narrow
    and expand always view."""
    op = n.op
    if isinstance(op, Reshape):
        return src_contiguous, True
    if isinstance(op, Narrow):
        lead = shapes[n.inputs[0]][:op.axis]
        return True, src_contiguous and int(np.prod(lead, dtype=np.int64)) == 1
    if isinstance(op, Expand):
        return True, src_contiguous and shapes[n.inputs[0]] == shapes[n.value]
    return False, True


def _needed_static(g: Graph, static: list[bool]) -> set[int]:
    """Static nodes whose values a dynamic node or an output reads (their producers are
    evaluated too, but need no slot afterwards)."""
    need = {v.node for v in g.outputs if static[v.node]}
    for n in g.nodes:
        if not static[n.id]:
            need.update(v.node for v in n.inputs if static[v.node])
    stack = list(need)
    closure = set(need)
    while stack:
        nid = stack.pop()
        for v in g.nodes[nid].inputs:
            if v.node not in closure:
                closure.add(v.node)
                stack.append(v.node)
    return closure


def _aligned(arr, cache: dict, node_id: int):
    """`arr`, or once (cached) an aligned copy when its data is not aligned to its element size
    (weights viewed straight out of a file's bytes): NumPy takes slow paths on such arrays
    (a 128-row embedding gather went from 0.02 ms to 15 ms)."""
    if not isinstance(arr, np.ndarray) or arr.flags.aligned:
        return arr
    key = ("aligned", node_id)
    if key not in cache:
        copy = aligned_arena(arr.nbytes).view(arr.dtype).reshape(arr.shape)
        copy[...] = arr
        cache[key] = copy
    return cache[key]


def _static_value(n: Node, g: Graph, weights, symbols, env, slot_of, cache) -> tuple:
    """The value(s) of a static node: a weight, a constant, or the op's reference applied to
    static inputs. Values that do not depend on the binding are cached across programs."""
    op = n.op
    if isinstance(op, Param):
        if op.name not in weights:
            raise InterpretError(f"param {op.name!r} {op.shape} has no value; pass it in "
                                 "params= (bz.init_params(g) draws random ones)")
        arr = np.asarray(weights[op.name])
        want = concrete(op.shape, symbols)
        if arr.shape != want:
            raise InterpretError(f"param {op.name!r} declared {op.shape} but its value has "
                                 f"shape {arr.shape}")
        return (_aligned(np.ascontiguousarray(arr, dtype=op.shape.dtype.np).reshape(arr.shape),
                         cache, n.id),)
    if isinstance(op, Constant):
        return (_aligned(op.value, cache, n.id),)
    key = ("static", n.id) if not _binds(n, g, cache) else None
    if key is not None and key in cache:
        return cache[key]
    args = [env[slot_of[v]] for v in n.inputs]
    try:
        res = op.reference(*args, symbols=symbols) if getattr(op, "needs_symbols", False) \
            else op.reference(*args)
    except Exception as e:  # noqa: BLE001 - name the node, keep the cause
        where = f" from {n.provenance}" if n.provenance else ""
        raise InterpretError(f"while preparing weights at node {n.label}{where}: "
                             f"{type(e).__name__}: {e}") from e
    # ascontiguousarray makes a 0-d result 1-d; keep the reference's shape
    out = tuple(np.ascontiguousarray(r).reshape(np.shape(r))
                for r in (res if isinstance(res, tuple) else (res,)))
    if key is not None:
        cache[key] = out
    return out


def _binds(n: Node, g: Graph, cache: dict) -> bool:
    """Whether a static node's value may differ between bindings of the symbols: it reads
    them, has or reads a symbolic shape, or reads a value that binds (`seq - 1` from a
    sym_const of seq is a static scalar of a binding-dependent value). Remembered in `cache`
    per node; static nodes are built in order, so an input's answer is there already."""
    key = ("binds", n.id)
    hit = cache.get(key)
    if hit is None:
        hit = bool(getattr(n.op, "needs_symbols", False)) or any(
            not s.is_static for s in n.outputs) or any(
            not g.shape_of(v).is_static or _binds(g.nodes[v.node], g, cache)
            for v in n.inputs)
        cache[key] = hit
    return hit


def _buffers(g, steps, last_use, shapes, outputs, alias) -> list[Buffer]:
    buffers: dict[Value, Buffer] = {}
    owner: dict[Value, Value] = {}
    for idx, step in enumerate(steps):
        for pos, v in enumerate(step.writes):
            nbytes = int(np.prod(shapes[v], dtype=np.int64)) * g.shape_of(v).dtype.itemsize
            host = _inplace_host(step, pos, idx, last_use, outputs, alias, owner, shapes, g)
            if host is not None:
                b = buffers[host]
                b.shares.append(v)
                b.last = max(b.last, last_use.get(v, idx))
                owner[v] = host
                continue
            buffers[v] = Buffer(v, nbytes, idx, last_use.get(v, idx))
            owner[v] = v
    return list(buffers.values())


def _inplace_host(step, pos, idx, last_use, outputs, alias, owner, shapes, g):
    """The buffer an output may reuse: a same-shaped input buffer that dies at this step."""
    if pos != 0 or not step.kernel.inplace:
        return None
    out = step.writes[0]
    for i in step.kernel.inplace:
        v = step.inputs[i]
        if v in alias or v not in owner or v in outputs or last_use.get(v) != idx:
            continue
        if sum(1 for u in step.inputs if alias.get(u, u) == v) > 1:
            continue  # v read twice, or also through a view: writing it would change that view
        if shapes[v] == shapes[out] and g.shape_of(v).dtype == g.shape_of(out).dtype:
            return owner[v]  # views of v count as reads of v, so none is live past this step
    return None
