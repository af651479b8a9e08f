"""`bz.save(g, path)` / `bz.load(path)`: a versioned JSON file plus a weights sidecar.

The JSON holds `{"format": "braze-graph", "version": 1, "graph": {...}, "weights": ...}`; each node
is `{"id", "kind", "attrs", "inputs": [[node, index], ...], "outputs": ["f32[batch, 384]"],
"name", "provenance"}` with attributes from `braze.ir.attrs`. Weights go to `<stem>.weights.npz`
next to the JSON (`m.json` -> `m.weights.npz`); the JSON lists each weight's npz key, dtype and
shape. bf16 is stored as its raw uint16 bits and restored from the recorded dtype. No sidecar is
written for a graph without weights. `load` rebuilds every node with `Graph.add_node` (so shapes
are re-inferred and compared with the stored ones) and raises ParseError / GraphError naming the
file and the problem for anything malformed."""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import BrazeError, GraphError, ParseError
from .attrs import _DecodeError, decode_array, decode_op, encode_array, encode_attrs
from .attrs import parse_shape_text as _parse_shape
from .dtypes import dtype_from_name, dtype_from_numpy
from .files import load_npz, open_regular
from .op import Value

if TYPE_CHECKING:
    from .graph import Graph

__all__ = ["save", "load", "graph_to_dict", "graph_from_dict", "sidecar_path", "FORMAT",
           "VERSION"]

FORMAT = "braze-graph"
VERSION = 1


def sidecar_path(path: str | os.PathLike) -> str:
    """Where the weights of the graph saved at `path` live: `<stem>.weights.npz` beside it."""
    path = os.fspath(path)
    stem = path[:-5] if path.endswith(".json") else path
    return stem + ".weights.npz"


def save(g: Graph, path: str | os.PathLike) -> None:
    """Write `g` to `path` (JSON) and its weights, if any, to `sidecar_path(path)`."""
    path = os.fspath(path)
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION,
                           "graph": graph_to_dict(g, inline_weights=False), "weights": None}
    if g.weights:
        side = sidecar_path(path)
        arrays, entries = {}, []
        for i, (name, arr) in enumerate(g.weights.items()):
            arr = np.asarray(arr)
            dt = dtype_from_numpy(arr.dtype)
            key = f"w{i}"
            arrays[key] = arr.view(np.uint16) if dt.name == "bf16" else arr
            entries.append({"name": name, "key": key, "dtype": dt.name, "shape": list(arr.shape)})
        with open(side, "wb") as f:
            np.savez(f, **arrays)
        doc["weights"] = {"file": os.path.basename(side), "entries": entries}
    with open(path, "w") as f:
        f.write(_dumps(doc))


def _dumps(doc: dict) -> str:
    """JSON with one node per line: diffable, and fast (the C encoder does each line)."""
    graph = dict(doc["graph"])
    nodes = graph.pop("nodes")
    head = json.dumps({k: v for k, v in doc.items() if k != "graph"})[:-1]
    body = ",\n  ".join(json.dumps(n) for n in nodes)
    rest = json.dumps(graph)[1:]
    return f'{head}, "graph": {{"nodes": [\n  {body}\n ], {rest}}}\n'


def graph_to_dict(g: Graph, *, inline_weights: bool = True) -> dict:
    """The JSON-able form of `g` (weights inline as base64 when `inline_weights`)."""
    nodes = []
    for n in g.nodes:
        d: dict[str, Any] = {"id": n.id, "kind": n.op.kind, "attrs": encode_attrs(n.op),
                             "inputs": [[v.node, v.index] for v in n.inputs],
                             "outputs": [str(s) for s in n.outputs]}
        if n.name is not None:
            d["name"] = n.name
        if n.provenance is not None:
            d["provenance"] = n.provenance
        nodes.append(d)
    out = {"name": g.name, "nodes": nodes, "inputs": list(g.input_ids),
           "params": list(g.param_ids), "outputs": [[v.node, v.index] for v in g.outputs]}
    if inline_weights and g.weights:
        out["weights"] = {k: encode_array(np.asarray(w)) for k, w in g.weights.items()}
    return out


def load(path: str | os.PathLike) -> Graph:
    """Read a graph written by `save`, with its weights. Errors name the file and the problem."""
    path = os.fspath(path)
    try:
        with open_regular(path, "r", encoding="utf-8") as f:  # not a FIFO or device
            text = f.read()
    except OSError as e:
        raise ParseError(f"{path}: cannot read braze graph ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ParseError(f"{path}: not a braze graph file (not UTF-8 text: byte "
                         f"{e.object[e.start]:#04x} at offset {e.start}); braze reads .json "
                         "graphs written by bz.save, .onnx models and .pt2 programs") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ParseError(f"{path}: not valid JSON ({e}); the file may be truncated or corrupt"
                         ) from None
    except RecursionError:
        raise ParseError(f"{path}: nested too deeply to read (not a braze graph; corrupt or "
                         "hostile?)") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ParseError(f"{path}: not a braze graph file (format is {got!r}, expected "
                         f"{FORMAT!r})")
    if doc.get("version") != VERSION:
        raise ParseError(f"{path}: unsupported braze-graph version {doc.get('version')!r}; "
                         f"this braze reads version {VERSION}")
    try:
        g = graph_from_dict(doc.get("graph"))
    except BrazeError as e:
        raise (ParseError if isinstance(e, ParseError) else GraphError)(f"{path}: {e}") from None
    except RecursionError:  # graphs in graphs (if / while bodies) deeper than JSON's own limit
        raise ParseError(f"{path}: its graphs are nested too deeply to read (bodies inside "
                         "bodies; corrupt or hostile?)") from None
    _load_weights(g, path, doc.get("weights"))
    return g


def graph_from_dict(d: Any) -> Graph:
    """Rebuild a graph from `graph_to_dict` output, validating everything."""
    from .graph import Graph

    if not isinstance(d, dict):
        raise ParseError(f"graph must be an object, got {type(d).__name__}")
    for key, typ in (("name", str), ("nodes", list), ("inputs", list), ("params", list),
                     ("outputs", list)):
        if not isinstance(d.get(key), typ):
            raise ParseError(f"graph field {key!r} is missing or not a {typ.__name__}")
    g = Graph(d["name"], record_provenance=False)
    for pos, nd in enumerate(d["nodes"]):
        _add_node(g, pos, nd)
    g.input_ids = _source_ids(g, d["inputs"], "input")
    g.param_ids = _source_ids(g, d["params"], "param")
    g.set_outputs([_value(v, len(g.nodes), f"graph output {i}")
                   for i, v in enumerate(d["outputs"])])
    weights = d.get("weights")
    if weights is not None:
        if not isinstance(weights, dict):
            raise ParseError("graph weights must be an object")
        params = _params_by_name(g)
        for name, enc in weights.items():
            try:
                arr = decode_array(enc)
            except (ValueError, TypeError, KeyError) as e:
                raise ParseError(f"weight {name!r}: {e}") from None
            _set_weight(g, params, name, arr)
    g.record_provenance = True
    return g


def _add_node(g: Graph, pos: int, nd: Any) -> None:
    if not isinstance(nd, dict):
        raise ParseError(f"node {pos} must be an object")
    where = f"node {pos}"
    if nd.get("id", pos) != pos:
        raise GraphError(f"{where} has id {nd.get('id')!r}; ids must equal positions")
    kind = nd.get("kind")
    if not isinstance(kind, str):
        raise ParseError(f"{where} has no op kind")
    where = f"node {pos} ({nd.get('name') or kind})"
    name, prov = nd.get("name"), nd.get("provenance")
    for key, v in (("name", name), ("provenance", prov)):
        if v is not None and not isinstance(v, str):
            raise ParseError(f"{where}: {key} must be a string")
    try:
        op = decode_op(kind, nd.get("attrs", {}))
    except ParseError as e:
        raise ParseError(f"{where}: {e}") from None
    raw_inputs = nd.get("inputs", [])
    if not isinstance(raw_inputs, list):
        raise ParseError(f"{where}: inputs must be a list")
    ins = [_value(v, pos, f"{where} input {i}") for i, v in enumerate(raw_inputs)]
    for i, v in enumerate(ins):
        if v.index >= len(g.nodes[v.node].outputs):
            raise GraphError(f"{where} input {i} refers to {v!r}, but node {v.node} has "
                             f"{len(g.nodes[v.node].outputs)} output(s)")
    try:
        g.add_node(op, ins, name=name, provenance=prov)
    except BrazeError as e:
        raise type(e)(f"{where}: {e}") from None
    stored = nd.get("outputs")
    inferred = [str(s) for s in g.nodes[pos].outputs]
    if stored is not None and stored != inferred:
        try:  # the same types written differently (a hand edit) are fine
            ok = isinstance(stored, list) and [str(_parse_shape(s)) for s in stored] == inferred
        except (_DecodeError, BrazeError, TypeError, AttributeError):
            ok = False
        if not ok:
            raise GraphError(f"{where}: stored output types {stored} differ from the inferred "
                             f"{inferred}; the file was edited or written by a different braze")


def _value(v: Any, limit: int, where: str) -> Value:
    ok = (isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v)
          and v[1] >= 0)
    if not ok:
        raise ParseError(f"{where}: a value must be [node, index], got {v!r}")
    if not 0 <= v[0] < limit:
        raise GraphError(f"{where} refers to node {v[0]}, but only nodes 0..{limit - 1} are "
                         "defined at that point (nodes must be in topological order, no cycles)")
    return Value(v[0], v[1])


def _source_ids(g: Graph, ids: list, kind: str) -> list[int]:
    from .ops.io import Input, Param

    cls = Input if kind == "input" else Param
    for nid in ids:
        if type(nid) is not int or not 0 <= nid < len(g.nodes):
            raise GraphError(f"graph {kind}s list {nid!r}, which is not a node")
        if not isinstance(g.nodes[nid].op, cls):
            raise GraphError(f"graph {kind}s list node {nid}, a {g.nodes[nid].op.kind}")
    if len(set(ids)) != len(ids):
        raise GraphError(f"graph {kind}s list a node twice: {ids}")
    return list(ids)


def _params_by_name(g: Graph) -> dict:
    """The Param ops of `g` by name (built once per load: a lookup per weight stays O(1))."""
    from .ops.io import Param

    return {g.nodes[i].op.name: g.nodes[i].op for i in g.param_ids
            if isinstance(g.nodes[i].op, Param)}


def _set_weight(g: Graph, params: dict, name: str, arr: np.ndarray) -> None:
    if name not in params:
        raise GraphError(f"weight {name!r} is not a param of graph {g.name!r}")
    shape = params[name].shape
    if tuple(arr.shape) != shape.dims or arr.dtype != shape.dtype.np:
        raise GraphError(f"weight {name!r} is {dtype_from_numpy(arr.dtype)}{list(arr.shape)}, "
                         f"param declares {shape}")
    g.weights[name] = arr


def _load_weights(g: Graph, path: str, meta: Any) -> None:
    if meta is None:
        return
    if not isinstance(meta, dict) or not isinstance(meta.get("entries"), list):
        raise ParseError(f"{path}: 'weights' must be {{file, entries}}")
    name = str(meta.get("file"))
    folder = os.path.dirname(path)
    side = os.path.join(folder, name)
    if os.path.basename(name) != name or name in ("", ".", "..") or \
            os.path.dirname(os.path.realpath(side)) != os.path.realpath(folder or "."):
        raise ParseError(f"{path}: its weights file must be a file beside it (save writes "
                         f"'<stem>.weights.npz'), got {name!r}; a path or link out of the "
                         "folder is refused (an untrusted graph must not read other files)")
    if not os.path.exists(side):
        raise ParseError(f"{path}: its weights file {side} is missing; copy it next to the JSON "
                         "(or load a graph saved without weights)")
    entries = []
    for e in meta["entries"]:
        try:
            name, key, dt, shape = e["name"], e["key"], dtype_from_name(e["dtype"]), e["shape"]
            if not isinstance(name, str) or not isinstance(key, str):
                raise TypeError("name and key must be strings")
        except (KeyError, TypeError, ValueError) as err:
            raise ParseError(f"{path}: bad weights entry {e!r} ({err})") from None
        entries.append((name, key, dt, shape))
    try:  # only the listed arrays, each checked against its size before it is allocated
        data = load_npz(side, {key for _, key, _, _ in entries})
    except (OSError, ValueError) as e:
        raise ParseError(f"{path}: weights file {side} is corrupt ({e})") from None
    params = _params_by_name(g)
    for name, key, dt, shape in entries:
        if key not in data:
            raise ParseError(f"{path}: weights file {side} has no array {key!r} for {name!r}")
        arr = data[key]
        if dt.name == "bf16" and arr.dtype == np.uint16:
            arr = arr.view(dt.np)
        if list(arr.shape) != shape or arr.dtype != dt.np:
            raise GraphError(f"{path}: weight {name!r} in {side} is {arr.dtype}{list(arr.shape)}"
                             f", the file records {dt}{shape}")
        try:
            _set_weight(g, params, name, arr)
        except GraphError as err:
            raise GraphError(f"{path}: {err}") from None
