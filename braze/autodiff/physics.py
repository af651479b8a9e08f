"""Physics-style losses for learned potentials: `grad_subgraph` (energy and forces, the negative
gradient of the energy with respect to the positions) and `build_force_energy_loss`
(w_f * MSE(forces, F_ref) + w_e * MSE(energy, E_ref)).

Both return ordinary graphs prepared for autodiff (`prepare_graph_for_ad`), so training a
potential on forces - a gradient of a loss that itself holds a gradient - is one more
`grad_with_loss` with respect to the weights: second order through the graph."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import AutodiffError
from ..ir.graph import Graph
from ..ir.op import Value
from ..passes.cleanup import dead_code_elimination
from .emit import scalar
from .prepare import prepare_graph_for_ad
from .reverse import clone_into, grad_with_loss, source_value

__all__ = ["grad_subgraph", "build_force_energy_loss", "ForceEnergyLossWeights"]


@dataclass(frozen=True)
class ForceEnergyLossWeights:
    """The weights of the force and energy terms of `build_force_energy_loss`."""

    forces: float = 1.0
    energy: float = 1.0


def grad_subgraph(g: Graph, positions: str = "pos") -> Graph:
    """A graph with g's inputs and params whose outputs are `[energy, forces]`: energy is g's
    first output (a float scalar), forces = -d energy / d `positions` (same shape as the input
    or param `positions`). The result is prepared for autodiff, so it can be differentiated
    again (with respect to the weights, or the positions)."""
    if not g.outputs:
        raise AutodiffError(f"graph {g.name!r} has no outputs; its first output is the energy")
    source_value(g, positions)
    grads = grad_with_loss(g, [positions], unused="error")
    energy, d_energy = grads.outputs
    grads.set_outputs([energy, grads.neg(d_energy)])
    grads.name = f"{g.name}_forces"
    return prepare_graph_for_ad(dead_code_elimination(grads)[0])


def _mse(b: Graph, a: Value, ref: Value) -> Value:
    squared = b.square(b.sub(a, ref))
    return b.mean(squared) if b.shape_of(squared).dims else squared


def build_force_energy_loss(g: Graph, positions: str = "pos",
                            weights: ForceEnergyLossWeights = ForceEnergyLossWeights(), *,
                            force_ref: str = "F_ref", energy_ref: str = "E_ref") -> Graph:
    """The training loss of a learned potential `g` (first output: the energy, a float scalar,
    of the input or param `positions`): a graph with g's inputs plus `force_ref` (the shape of
    `positions`) and `energy_ref` (the energy's shape), and one scalar output
    `weights.forces * MSE(-dE/dpositions, F_ref) + weights.energy * MSE(E, E_ref)` (means over
    all elements). Prepared for autodiff: `grad_with_loss(loss, [weight names])` differentiates
    through the force term (second order)."""
    forces_graph = grad_subgraph(g, positions)
    b = Graph(f"{g.name}_force_energy_loss", record_provenance=False)
    vmap = clone_into(b, forces_graph)
    energy, forces = (vmap[v] for v in forces_graph.outputs)
    for name in (force_ref, energy_ref):
        if any(getattr(n.op, "name", None) == name for n in b.nodes if n.op.source):
            raise AutodiffError(f"graph {g.name!r} already has an input or param named "
                                f"{name!r}; pass another force_ref / energy_ref name")
    f_ref = b.input(force_ref, b.shape_of(forces))
    e_ref = b.input(energy_ref, b.shape_of(energy))
    loss = b.add(b.mul(scalar(b, weights.forces, forces), _mse(b, forces, f_ref)),
                 b.mul(scalar(b, weights.energy, energy), _mse(b, energy, e_ref)))
    b.set_outputs([loss])
    return prepare_graph_for_ad(dead_code_elimination(b)[0])
