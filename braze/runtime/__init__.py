"""The compiled CPU executor: `compile(graph, target)` -> Executable (memory plan, kernels,
weight preparation), see executable.py."""
from .executable import DispatchReport, Executable, compile  # noqa: F401
