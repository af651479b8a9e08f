"""Automatic differentiation on braze graphs: VJP / JVP rules registered against op classes
(`registry`, `rules/`), reverse mode (`grad_with_loss`), forward mode (`jvp`), and the higher-order
forms built on them (`hvp`, `nth_order_grad`, `directional_nth_grad`), and vectorization
(`vmap`, with batching rules per op class), physics-style losses (`grad_subgraph`,
`build_force_energy_loss`). `prepare_graph_for_ad` is
the one place that unfuses and decomposes a graph before differentiation. Results are ordinary
braze graphs."""
from .custom import inline_custom_fn_for_autodiff
from .forward import jvp
from .higher import directional_nth_grad, hvp, nth_order_grad
from .physics import ForceEnergyLossWeights, build_force_energy_loss, grad_subgraph
from .prepare import prepare_graph_for_ad
from .registry import (
    differentiability,
    get_jvp,
    get_vjp,
    jvp_rule,
    non_differentiable,
    unbroadcast,
    vjp_rule,
)
from .reverse import grad_with_loss
from .scan import convert_scans_for_ad
from .vmap import batch_rule, vmap

__all__ = ["vjp_rule", "jvp_rule", "non_differentiable", "get_vjp", "get_jvp",
           "differentiability", "unbroadcast", "grad_with_loss", "jvp", "hvp", "nth_order_grad",
           "directional_nth_grad", "prepare_graph_for_ad", "vmap", "batch_rule",
           "grad_subgraph", "build_force_energy_loss", "ForceEnergyLossWeights",
           "inline_custom_fn_for_autodiff", "convert_scans_for_ad"]
