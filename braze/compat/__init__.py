"""Compatibility layers: other libraries' fusion APIs re-created on braze's IR and passes.

`braze.compat.axonml` mirrors the AxonML fusion crate (FusedLinear, FusedElementwise,
FusionOptimizer)."""
