"""`export_onnx`: any braze graph, fused or not, to an ONNX model ONNX Runtime runs.

Each node maps to standard ONNX ops, or (target "onnxruntime") to ONNX Runtime contrib ops
where one means exactly the same thing (ops_contrib.py); a composite node with no mapping for
the target is written as its own decomposition (the kinds' `decompose`, the same one unfuse and
the interpreter use), recursively. Symbolic dims stay `dim_param`s on inputs and outputs and
are computed from the inputs' shapes inside the model. Weights become initializers, stored as
external data next to the file when they exceed what one protobuf holds."""
from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from ...ir.graph import Graph
from ...ir.ops.io import Constant, Input, Param
from ...passes.expand import expand_where
from .builder import ExportError, OnnxBuilder, onnx_type
from .registry import EXPORTERS, TARGETS, accepts

__all__ = ["export_onnx", "to_onnx_model", "ExportError"]

EXTERNAL_DATA_BYTES = 1_800_000_000  # above this, initializers go to an external data file
DEFAULT_OPSET = 17


def _legal(g: Graph, target: str) -> Graph:
    """Decompose every node the target has no mapping for (repeatedly)."""
    out, _ = expand_where(g, lambda node, graph: not accepts(node, graph, target))
    return out


def to_onnx_model(graph: Graph, target: str = "onnxruntime", *, opset: int = DEFAULT_OPSET,
                  params: Mapping[str, np.ndarray] | None = None):
    """The ONNX ModelProto for `graph` (see export_onnx)."""
    from onnx import helper

    if target not in TARGETS:
        raise ExportError(f"unknown export target {target!r}; use 'onnxruntime' or 'standard'")
    if not 17 <= opset <= 21:
        raise ExportError(f"braze exports ONNX opsets 17..21, not {opset}")
    weights = {**graph.weights, **(params or {})}
    missing = [n.op.name for n in graph.params if n.op.name not in weights]
    if missing:
        raise ExportError(f"params {missing} have no values; pass params= (bz.init_params(g) "
                          "draws random ones) or store them with g.set_weight")
    g = _legal(graph, target)
    b = OnnxBuilder(g, opset)
    inputs = []
    for n in g.nodes:
        op = n.op
        if isinstance(op, Input):
            b.names[n.value] = op.name
            inputs.append(_value_info(op.name, op.shape))
        elif isinstance(op, Param):
            arr = np.asarray(weights[op.name]).astype(op.shape.dtype.np, copy=False)
            b.names[n.value] = op.name
            b.add_initializer(op.name, arr)
        elif isinstance(op, Constant):
            b.names[n.value] = b.const(op.value)
        else:
            emit = EXPORTERS[type(op)]
            ins = [b.name(v) for v in n.inputs]
            try:
                outs = emit(b, n, ins, target)
            except ExportError:
                raise
            except Exception as e:  # noqa: BLE001 - name the node
                raise ExportError(f"cannot export node {n.describe()}: {type(e).__name__}: "
                                  f"{e}") from e
            for v, name in zip(n.values, outs, strict=True):
                b.names[v] = name
    outputs, seen = [], set()
    for i, v in enumerate(g.outputs):
        name = b.name(v)
        out_name = f"output_{i}" if i else "output"
        b.op("Identity", [name], outputs=[out_name])
        seen.add(out_name)
        outputs.append(_value_info(out_name, g.shape_of(v)))
    graph_proto = helper.make_graph(b.nodes, graph.name, inputs, outputs, b.initializers)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1)
                                                 for d in sorted(b.domains)]
    model = helper.make_model(graph_proto, opset_imports=opsets, producer_name="braze")
    model.ir_version = min(model.ir_version, 10)
    return model


def _value_info(name: str, shape):
    from onnx import helper

    dims = [d if isinstance(d, int) else str(d) for d in shape.dims]
    return helper.make_tensor_value_info(name, onnx_type(shape.dtype), dims)


def export_onnx(graph: Graph, path: str | os.PathLike, target: str = "onnxruntime", *,
                opset: int = DEFAULT_OPSET, params: Mapping[str, np.ndarray] | None = None,
                check: bool = True) -> str:
    """Write `graph` as an ONNX model at `path`. target="onnxruntime" uses ONNX Runtime's
    contrib ops (com.microsoft) for fused kinds that have one; "standard" writes standard ONNX
    only. `params` supplies weights for params without stored values. The model is checked
    with onnx.checker (full_check) unless `check=False`. Returns the path."""
    import onnx

    model = to_onnx_model(graph, target, opset=opset, params=params)
    path = os.fspath(path)
    big = sum(t.ByteSize() for t in model.graph.initializer) > EXTERNAL_DATA_BYTES
    if big:
        location = os.path.basename(path) + ".data"
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=location, size_threshold=1024)
        if check:
            onnx.checker.check_model(path, full_check=True)
    else:
        if check:
            try:
                onnx.checker.check_model(model, full_check=True)
            except Exception as e:  # noqa: BLE001 - a bug of ours, named
                raise ExportError(f"the exported model for {graph.name!r} does not pass "
                                  f"onnx.checker: {e}") from e
        onnx.save_model(model, path)
    return path
