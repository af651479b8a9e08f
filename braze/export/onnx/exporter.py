"""`export_onnx`: any braze graph, fused or not, to an ONNX model ONNX Runtime runs.

Each node maps to standard ONNX ops, or (target "onnxruntime") to ONNX Runtime contrib ops
where one means exactly the same thing (ops_contrib.py); a composite node with no mapping for
the target is written as its own decomposition (the kinds' `decompose`, the same one unfuse and
the interpreter use), recursively. Symbolic dims stay `dim_param`s on inputs and outputs and
are computed from the inputs' shapes inside the model. Weights become initializers, stored as
external data next to the file when they exceed what one protobuf holds. Bindings the inputs
refuse (`Input.excludes`) are refused by the model too (guards.py) and recorded in its
metadata_props."""
from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from ...frontends.onnx.exclusions import EXCLUDES_KEY, encode_excludes
from ...ir.graph import Graph
from ...ir.ops.io import Constant, Input, Param
from ...passes.expand import expand_where
from .builder import ExportError, OnnxBuilder, fill_tensor, onnx_type, tensor_type
from .guards import guard_outputs
from .registry import EXPORTERS, TARGETS, accepts

__all__ = ["export_onnx", "to_onnx_model", "ExportError", "emit_nodes", "legal_for",
           "value_info"]

EXTERNAL_DATA_BYTES = 1_800_000_000  # above this, initializers go to an external data file
DEFAULT_OPSET = 17


def legal_for(g: Graph, target: str) -> Graph:
    """Decompose every node the target has no mapping for (repeatedly)."""
    out, _ = expand_where(g, lambda node, graph: not accepts(node, graph, target))
    return out


def to_onnx_model(graph: Graph, target: str = "onnxruntime", *, opset: int = DEFAULT_OPSET,
                  params: Mapping[str, np.ndarray] | None = None):
    """The ONNX ModelProto for `graph`, weights inline (see export_onnx)."""
    model, b = _build(graph, target, opset, params)
    b.write_initializers(model.graph)
    return model


def _build(graph: Graph, target: str, opset: int, params):
    """(ModelProto without initializers, the builder holding them)."""
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
    g = legal_for(graph, target)
    weights = {**g.weights, **weights}  # and the params decompositions added (inlined bodies)
    b = OnnxBuilder(g, opset)
    inputs = emit_nodes(b, g, weights, target)
    outputs, seen = [], set()
    in_ops = [n.op for n in g.inputs]
    names = guard_outputs(b, in_ops, [b.name(v) for v in g.outputs])
    for i, (v, name) in enumerate(zip(g.outputs, names)):
        out_name = b.unique(f"output_{i}" if i else "output")
        b.op("Identity", [name], outputs=[out_name])
        seen.add(out_name)
        outputs.append(value_info(out_name, g.shape_of(v)))
    graph_proto = helper.make_graph(b.nodes, graph.name, inputs, outputs)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1)
                                                 for d in sorted(b.domains)]
    model = helper.make_model(graph_proto, opset_imports=opsets, producer_name="braze")
    model.ir_version = min(model.ir_version, 10)
    excludes = encode_excludes(in_ops)
    if excludes is not None:
        helper.set_model_props(model, {EXCLUDES_KEY: excludes})
    return model, b  # initializers go in after make_model, which copies the graph it is given


def emit_nodes(b: OnnxBuilder, g: Graph, weights: Mapping, target: str,
               input_names: list[str] | None = None) -> list:
    """Write `g`'s nodes (legal for `target`) into `b`, filling `b.names`. Inputs take their
    own names, or `input_names` in order (a body bound to the names its caller gives it).
    Returns the inputs' ValueInfos."""
    inputs = []
    bound = dict(zip(g.input_ids, input_names)) if input_names is not None else {}
    for nid, n in enumerate(g.nodes):
        op = n.op
        if isinstance(op, Input):
            name = bound.get(nid, op.name)
            b.names[n.value] = name
            inputs.append(value_info(name, op.shape))
        elif isinstance(op, Param):
            arr = np.asarray(weights[op.name]).astype(op.shape.dtype.np, copy=False)
            b.names[n.value] = op.name
            b.add_initializer(op.name, arr)
        elif isinstance(op, Constant):
            b.names[n.value] = b.const(op.value)
        else:
            emit = EXPORTERS.get(type(op))
            if emit is None:
                raise ExportError(f"cannot export node {n.describe()}: braze has no ONNX mapping "
                                  f"for op kind {op.kind!r} and it has no decomposition")
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
    return inputs


def value_info(name: str, shape):
    from onnx import helper

    dims = [d if isinstance(d, int) else str(d) for d in shape.dims]
    return helper.make_tensor_value_info(name, onnx_type(shape.dtype), dims)


def export_onnx(graph: Graph, path: str | os.PathLike, target: str = "onnxruntime", *,
                opset: int = DEFAULT_OPSET, params: Mapping[str, np.ndarray] | None = None,
                external_data: bool | None = None, check: bool = True) -> str:
    """Write `graph` as an ONNX model at `path`. target="onnxruntime" uses ONNX Runtime's
    contrib ops (com.microsoft) for fused kinds that have one; "standard" writes standard ONNX
    only. `params` supplies weights for params without stored values. Weights go to
    `<path>.data` next to the model when `external_data` is True, or (None, the default) when
    they exceed what one protobuf file holds. The model is checked with onnx.checker
    (full_check) unless `check=False`. Returns the path."""
    model, b = _build(graph, target, opset, params)
    path = os.fspath(path)
    if external_data is None:
        external_data = b.initializer_bytes() > EXTERNAL_DATA_BYTES
    if external_data:
        location = os.path.basename(path) + ".data"
        with open(os.path.join(os.path.dirname(os.path.abspath(path)), location), "wb") as f:
            b.write_initializers(model.graph, data_file=f, location=location)
    if check:
        _check(model, b, graph.name)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
        if not external_data:
            b.stream_initializers(f)
    return path


def _check(model, b: OnnxBuilder, name: str) -> None:
    """onnx.checker (full check: structure, types, shape inference) on the model with its
    large weights declared as typed graph inputs instead of data - the same graph, checked in
    milliseconds instead of re-serializing hundreds of megabytes."""
    import onnx
    from onnx import helper

    skeleton = onnx.ModelProto()
    skeleton.ir_version = model.ir_version
    skeleton.opset_import.extend(model.opset_import)
    g = skeleton.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    for t_name, arr in b.initializers:
        if arr.nbytes <= 4096:
            fill_tensor(g.initializer.add(), t_name, arr)
        else:
            g.input.append(helper.make_tensor_value_info(t_name, tensor_type(arr),
                                                         list(arr.shape)))
    try:
        onnx.checker.check_model(skeleton, full_check=True)
    except Exception as e:  # noqa: BLE001 - a bug of ours, named
        raise ExportError(f"the exported model for {name!r} does not pass onnx.checker: "
                          f"{e}") from e
