"""The compiled CPU executor: `compile(graph, target)` -> Executable (memory plan, kernels,
weight preparation), see executable.py."""
from .executable import Executable, KernelDispatchReport, compile  # noqa: F401
