"""`compile_training`: a loss graph becomes a `TrainingStep` - a compiled forward executable, a
compiled backward executable (the fused `grad_with_loss` graph, which recomputes the forward on
the way) and an optimizer, around one weight region; optionally a learning-rate schedule and
clipping of the gradients by their global norm before each update.

What is shared, and how:
- Weights. The trained params live once, in one flat array per dtype (the weight region);
  `.params` are views of it. Both executables read them as run-time inputs (the params are
  promoted to graph inputs of the same name and fed as those views - no copy), and the
  optimizer updates the region in place, so the next forward or backward run sees the update.
  Params are promoted because a compiled graph computes anything derived from params alone
  (transposed or bf16-rounded weights) once; with trained params that cache would go stale.
  Params that are not trained stay params (their weight preparation still runs once).
- Activations. Forward and backward never run at the same time, so their programs plan into
  one `SharedArena`: each takes the front of one buffer, sized by the larger (backward) plan.
- Gradients live in a grad region with the weight region's layout (copied there straight from
  the arena, once), so the optimizer updates every param of a dtype with a few whole-array
  NumPy ops."""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..autodiff.control import lift_body_params
from ..autodiff.reverse import grad_with_loss
from ..errors import BrazeError, InterpretError
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.ops.io import Input, Param
from .clipping import clip_grad_norm
from .optimizers import Optimizer
from .schedules import LRSchedule

__all__ = ["compile_training", "TrainingStep", "WeightRegion", "promote_trained_params"]


class WeightRegion:
    """Arrays of several named params stored back to back in one flat array per dtype.
    `views[name]` is the param's array (a view); `flat[dtype]` the whole region of that dtype."""

    def __init__(self, shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]]):
        sizes: dict[np.dtype, int] = {}
        for dims, dt in shapes.values():
            sizes[dt] = sizes.get(dt, 0) + int(np.prod(dims, dtype=np.int64))
        self.flat = {dt: np.zeros(n, dtype=dt) for dt, n in sizes.items()}
        used = dict.fromkeys(sizes, 0)
        self.views: dict[str, np.ndarray] = {}
        for name, (dims, dt) in shapes.items():
            n = int(np.prod(dims, dtype=np.int64))
            self.views[name] = self.flat[dt][used[dt]:used[dt] + n].reshape(dims)
            used[dt] += n

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.flat.values())


def _param_nodes(g: Graph) -> dict[str, Node]:
    return {g.nodes[i].op.name: g.nodes[i] for i in g.param_ids}


def promote_trained_params(g: Graph, names: Sequence[str]) -> Graph:
    """A copy of `g` where the params called `names` are graph inputs of the same name and
    shape (their stored weights dropped). `g` is not changed."""
    out = Graph(g.name, record_provenance=False)
    vmap = {}
    for node in g.nodes:
        if isinstance(node.op, Param) and node.op.name in names:
            (new,) = out.clone_node(Node(node.id, Input(node.op.name, node.op.shape), (),
                                         node.outputs, node.name, node.provenance), [])
            vmap[node.value] = new
            continue
        vmap.update(zip(node.values, out.clone_node(node, [vmap[v] for v in node.inputs], g)))
    out.weights = {k: v for k, v in g.weights.items() if k not in names}
    out.set_outputs([vmap[v] for v in g.outputs])
    return out


class RegionViews(Mapping):
    """A read-only name -> array mapping over a region's views. The arrays are writable (assign
    into them: `step.params["w"][...] = value`); rebinding a name is refused, since the
    executables read and the optimizer updates the region's arrays, not a replacement."""

    def __init__(self, views: dict[str, np.ndarray], what: str):
        self._views = views
        self._what = what

    def __getitem__(self, name: str) -> np.ndarray:
        return self._views[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def __setitem__(self, name, value) -> None:
        raise BrazeError(f"TrainingStep.{self._what}[{name!r}] cannot be replaced: it is a view "
                         "of the weight region the compiled step reads and updates; assign into "
                         f"it instead: step.{self._what}[{name!r}][...] = value")

    def __delitem__(self, name) -> None:
        self.__setitem__(name, None)

    def __or__(self, other: Mapping) -> dict:  # views | feeds, as with the dict it was
        return {**self._views, **other}

    def __ror__(self, other: Mapping) -> dict:  # feeds | step.params
        return {**other, **self._views}

    def __repr__(self) -> str:
        return f"RegionViews({self._what}: {', '.join(self._views)})"


@dataclass
class MemoryUse:
    """Bytes held by a training step: weight and grad regions, optimizer state, and the shared
    activation arena with each program's own peak (the arena is the larger of the two)."""

    weights: int
    grads: int
    optimizer_state: int
    arena: int
    forward_peak: int
    backward_peak: int

    def __str__(self) -> str:
        mib = 2 ** 20
        return (f"weights {self.weights / mib:.2f} MiB (shared by forward and backward), grads "
                f"{self.grads / mib:.2f} MiB, optimizer state {self.optimizer_state / mib:.2f} "
                f"MiB, one arena {self.arena / mib:.2f} MiB (forward plan "
                f"{self.forward_peak / mib:.2f} MiB, backward plan "
                f"{self.backward_peak / mib:.2f} MiB)")


class TrainingStep:
    """A compiled training step. `step(feeds)` runs the backward executable (forward included)
    and the optimizer, and returns the loss; `eval(feeds)` runs the forward executable and
    returns the graph's outputs. `params` (name -> array view of the weight region) always holds
    the current weights; `grads` the gradients of the last step; `report` the FusionReport of
    the backward graph (`forward_report` of the forward one). With a `schedule`, step k
    updates with lr = optimizer.lr * schedule.factor(k) (`lr` is the next step's); with
    `clip_grad_norm`, the gradients are clipped to that global norm before the update and
    `grad_norm` holds the last step's norm before clipping."""

    def __init__(self, graph: Graph, wrt: list[str], optimizer: Optimizer, region: WeightRegion,
                 forward, backward, arena, schedule: LRSchedule | None = None,
                 clip_grad_norm: float | None = None):
        self.graph = graph
        self.wrt = wrt
        self.optimizer = optimizer
        self.region = region
        self.forward = forward
        self.backward = backward
        self.arena = arena
        self.grad_region = WeightRegion({n: (v.shape, v.dtype) for n, v in region.views.items()})
        self.state = {dt: optimizer.init(flat) for dt, flat in region.flat.items()}
        self.schedule = schedule
        self.clip_grad_norm = clip_grad_norm
        self.grad_norm: float | None = None
        self.steps = 0

    @property
    def lr(self) -> float:
        """The learning rate the next `step` updates with."""
        base = self.optimizer.lr
        return base if self.schedule is None else self.schedule.lr(base, self.steps)

    @property
    def params(self) -> Mapping[str, np.ndarray]:
        return RegionViews(self.region.views, "params")

    @property
    def grads(self) -> Mapping[str, np.ndarray]:
        return RegionViews(self.grad_region.views, "grads")

    @property
    def report(self):
        return self.backward.report

    @property
    def forward_report(self):
        return self.forward.report

    def _feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not isinstance(feeds, Mapping):
            raise BrazeError(f"feeds must map input names to arrays (a dict), got "
                             f"{type(feeds).__name__}; inputs: {self._input_names()}")
        clash = [n for n in self.wrt if n in feeds]
        if clash:
            raise BrazeError(f"feeds name trained params {clash}; their values live in "
                             "TrainingStep.params (assign into those arrays to change them)")
        return {**feeds, **self.region.views}

    def _input_names(self) -> str:
        return ", ".join(n.op.name for n in self.graph.inputs)

    def gradients(self, feeds: Mapping[str, np.ndarray]) -> float:
        """Run the backward executable only: fills `grads`, returns the loss (no update)."""
        loss, *grads = self.backward(self._feeds(feeds), copy=False)
        for name, grad in zip(self.wrt, grads):
            np.copyto(self.grad_region.views[name], grad)
        return float(np.asarray(loss).reshape(-1)[0])

    def step(self, feeds: Mapping[str, np.ndarray]) -> float:
        """One training step on `feeds` (the loss graph's inputs); returns the loss before the
        update."""
        loss = self.gradients(feeds)
        if self.clip_grad_norm is not None:
            self.grad_norm = clip_grad_norm(self.grad_region.flat.values(), self.clip_grad_norm)
        # the lr is passed only with a schedule, so an Optimizer subclass whose apply takes
        # no lr keeps working without one
        scheduled = {} if self.schedule is None else {"lr": self.lr}
        for dt, flat in self.region.flat.items():
            self.optimizer.apply(flat, self.grad_region.flat[dt], self.state[dt], **scheduled)
        self.steps += 1
        return loss

    def eval(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The loss graph's outputs at the current weights (forward executable only)."""
        full = self._feeds(feeds)
        self.backward.program(full)  # plan the larger program first: it sizes the shared arena
        return self.forward(full)

    def memory(self) -> MemoryUse:
        """Bytes in use (after at least one step or eval)."""
        state = sum(a.nbytes for s in self.state.values() for a in s.values()
                    if isinstance(a, np.ndarray))
        peak = {}
        for which, exe in (("forward", self.forward), ("backward", self.backward)):
            try:
                peak[which] = exe.plan.peak
            except InterpretError:  # not run yet
                peak[which] = 0
        return MemoryUse(self.region.nbytes, self.grad_region.nbytes, state,
                         self.arena.buffer.nbytes, peak["forward"], peak["backward"])


def _declared(g: Graph, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The entries of `values` that `g` has a param for (the backward graph drops frozen params
    that only outputs after the loss read)."""
    names = {n.op.name for n in g.params}
    return {k: v for k, v in values.items() if k in names}


def compile_training(g: Graph, wrt: Sequence[str] | str, optimizer: Optimizer, *,
                     params: Mapping[str, np.ndarray] | None = None, precision=None,
                     target: str = "cpu", schedule: LRSchedule | None = None,
                     clip_grad_norm: float | None = None) -> TrainingStep:
    """Compile a training step for the loss graph `g` (first output: the scalar loss) that
    trains the params named in `wrt` with `optimizer` (bz.SGD / bz.Adam / bz.AdamW). Initial
    weights come from `params`, else the graph's stored weights; `precision` is passed to
    bz.compile. The backward graph is `grad_with_loss(g, wrt)`, fused for `target`.
    `schedule` (bz.WarmupCosine, bz.WarmupLinear, bz.StepDecay) scales the learning rate per
    step; `clip_grad_norm` clips the gradients to that global 2-norm before each update."""
    from ..runtime.executable import compile as compile_exe
    from ..runtime.plan import SharedArena

    names = [wrt] if isinstance(wrt, str) else list(wrt)
    if not isinstance(optimizer, Optimizer):
        raise BrazeError(f"optimizer must be bz.SGD(...), bz.Adam(...) or bz.AdamW(...), got "
                         f"{optimizer!r}")
    if schedule is not None and not isinstance(schedule, LRSchedule):
        raise BrazeError(f"schedule must be bz.WarmupCosine(...), bz.WarmupLinear(...) or "
                         f"bz.StepDecay(...), got {schedule!r}")
    if clip_grad_norm is not None and (isinstance(clip_grad_norm, bool) or not isinstance(
            clip_grad_norm, (int, float)) or not clip_grad_norm > 0):
        raise BrazeError(f"clip_grad_norm must be a number > 0 (the largest global gradient "
                         f"norm) or None, got {clip_grad_norm!r}")
    g = lift_body_params(g)  # params held in if / while bodies train like the others
    nodes = _param_nodes(g)
    unknown = [n for n in names if n not in nodes]
    if unknown or len(set(names)) != len(names):
        raise BrazeError(f"compile_training trains params; graph {g.name!r} has no param "
                         f"{unknown} (or a name repeats); its params are {sorted(nodes)}")
    values = {**g.weights, **dict(params or {})}
    shapes = {}
    for n in names:
        op = nodes[n].op
        if not op.shape.is_static:
            raise BrazeError(f"trained param {n!r} has symbolic shape {op.shape}; trained "
                             "params need static shapes")
        if n not in values:
            raise BrazeError(f"trained param {n!r} {op.shape} has no initial value; pass "
                             "params= (bz.init_params(g) draws random ones)")
        shapes[n] = (tuple(int(d) for d in op.shape.dims), np.dtype(op.shape.dtype.np))
    region = WeightRegion(shapes)
    for n, view in region.views.items():
        arr = np.asarray(values[n])
        if arr.shape != view.shape:
            raise BrazeError(f"initial value of param {n!r} has shape {arr.shape}, the param "
                             f"is {nodes[n].op.shape}")
        view[...] = arr
    frozen = {k: v for k, v in values.items() if k not in names}
    trainable = promote_trained_params(g, names)
    backward_graph = grad_with_loss(trainable, names, unused="zeros")
    arena = SharedArena()
    backward = compile_exe(backward_graph, target, params=_declared(backward_graph, frozen),
                           precision=precision, shared_arena=arena)
    forward = compile_exe(trainable, target, params=_declared(trainable, frozen),
                          precision=precision, shared_arena=arena)
    return TrainingStep(g, names, optimizer, region, forward, backward, arena, schedule,
                        clip_grad_norm)
