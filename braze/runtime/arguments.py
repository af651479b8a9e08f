"""The checks of `bz.compile`'s and an executable's arguments: a wrong type, an unknown param
name, a param of the wrong dtype or shape, feeds that are no mapping or name inputs the graph
lacks are a `BrazeError` naming what to fix, not a Python error from deep inside (or, for a
misspelled param, a silently ignored value)."""
from __future__ import annotations

from collections.abc import Mapping
from numbers import Real

import numpy as np

from ..errors import BrazeError, InterpretError
from ..ir.graph import Graph
from .codegen.builds import BuildLimits

__all__ = ["compile_args", "checked_params", "feeds_mapping", "build_limits"]


def compile_args(graph, target, params, precision, threads) -> dict[str, np.ndarray]:
    """Check `bz.compile`'s arguments; returns the params as a dict (see checked_params)."""
    if not isinstance(graph, Graph):
        raise BrazeError(f"bz.compile needs a braze Graph, got {type(graph).__name__}; build "
                         "one (bz.Graph, bz.models) or import one (bz.import_onnx, "
                         "bz.import_torch)")
    if target != "cpu":
        raise BrazeError(f"bz.compile builds for this machine's CPU (target 'cpu'), got "
                         f"{target!r}; other targets ('gpu', 'onnxruntime') are for bz.fuse "
                         "and bz.export_onnx")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 0):
        raise BrazeError(f"threads must be a whole number >= 0 (0 or None: as many as the "
                         f"kernels choose), got {threads!r}")
    if precision is not None and not isinstance(precision, str):
        from ..passes.precision import PrecisionPolicy

        if not isinstance(precision, PrecisionPolicy):
            raise BrazeError(f"precision must be None, a name ('bf16', 'f16') or a "
                             f"PrecisionPolicy, got {precision!r}")
    return checked_params(graph, params, "bz.compile")


def build_limits(timeout, max_kernels, progress) -> BuildLimits:
    """`bz.compile`'s build options, checked: a timeout in seconds > 0 or None, a kernel
    count >= 0 or None, progress True / False."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, Real)
                                or not timeout > 0):
        raise BrazeError(f"build_timeout must be a number of seconds > 0 or None (no limit), "
                         f"got {timeout!r}")
    if max_kernels is not None and (isinstance(max_kernels, bool) or
                                    not isinstance(max_kernels, int) or max_kernels < 0):
        raise BrazeError(f"max_kernels must be a whole number >= 0 or None (no limit), got "
                         f"{max_kernels!r}")
    if not isinstance(progress, bool):
        raise BrazeError(f"progress must be True or False, got {progress!r}")
    return BuildLimits(None if timeout is None else float(timeout), max_kernels, progress)


def checked_params(graph: Graph, params, where: str) -> dict[str, np.ndarray]:
    """`params` (None or a mapping of param name -> array) checked against the graph's params:
    every name one of them, every value of its declared dtype and static dims."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise BrazeError(f"{where}: params must map param names to arrays, got "
                         f"{type(params).__name__}")
    declared = {n.op.name: n.op.shape for n in graph.params}
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise BrazeError(f"{where}: no param named {', '.join(map(repr, unknown))} in graph "
                         f"{graph.name!r}; its params are {', '.join(sorted(declared)) or 'none'}")
    out = {}
    for name, value in params.items():
        arr = np.asarray(value)
        shape = declared[name]
        if arr.dtype != shape.dtype.np:
            raise BrazeError(f"{where}: param {name!r} is declared {shape.dtype} but was given "
                             f"{arr.dtype}; cast it (e.g. .astype(np.{shape.dtype.np}))")
        static = all(isinstance(d, int) for d in shape.dims)
        if static and tuple(arr.shape) != tuple(shape.dims):
            raise BrazeError(f"{where}: param {name!r} has shape {tuple(arr.shape)}; the graph "
                             f"declares {tuple(shape.dims)}")
        out[name] = arr
    return out


def feeds_mapping(graph: Graph, feeds) -> Mapping[str, np.ndarray]:
    """`feeds` checked to be a mapping that names only the graph's inputs."""
    if not isinstance(feeds, Mapping):
        raise InterpretError(f"feeds must map input names to arrays (a dict), got "
                             f"{type(feeds).__name__}; graph {graph.name!r} takes "
                             f"{', '.join(n.op.name for n in graph.inputs) or 'no inputs'}")
    names = {n.op.name for n in graph.inputs}
    extra = sorted((k for k in feeds if k not in names), key=repr)  # keys of any types
    if extra:
        raise InterpretError(f"feeds name {', '.join(map(repr, extra))}, which graph "
                             f"{graph.name!r} has no input for; its inputs are "
                             f"{', '.join(sorted(names)) or 'none'}")
    return feeds
