"""`import_onnx`: an ONNX model to a braze Graph, node by node.

Graph inputs keep their names (dim_param -> symbolic dims, unknown dims -> fresh symbols);
float initializers with more than one element become params with stored values (weights); small
integer and scalar tensors are compile-time values that shape computations fold through
(known.py), materialized as constants only where data needs them. Every braze node records its
ONNX node's name as provenance, so a fusion miss names the ONNX node. Recognizing logical ops
(LayerNorm written in primitives, attention, ...) is canonicalization's job, not the importer's.
Subgraphs (If branches, Loop / Scan bodies) are imported by child importers (subgraphs.py) for
the control-flow converters (ops/control.py)."""
from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from ...errors import BrazeError, FrontendError, UnsupportedOpsError
from ...interpret import interpret
from ...ir.graph import Graph
from ...ir.op import Value
from ...ir.shapes import Shape
from ...ir.symbolic import MIN_SYMBOL_VALUE, SymDim, eval_dim
from ..clamps import check_assumptions, clamp_choice
from . import ops  # noqa: F401  (registers the converters)
from .context import CONVERTERS, ImportContext, NodeView, Tensor
from .dtypes import braze_dtype, onnx_dtype, tensor_array
from .exclusions import EXCLUDES_KEY, PASS_PREFIX, decode_excludes, is_guard_node
from .known import FOLDERS, FOLDERS_PICK, Known, NotFoldable
from .loader import load_model
from .loader import proto_str as _str
from .schema import check_input_types, check_node, node_schema
from .subgraphs import SubgraphImports, node_captures, node_subgraphs

__all__ = ["import_onnx", "SUPPORTED_OPS", "MIN_OPSET", "MAX_OPSET"]

MIN_OPSET, MAX_OPSET = 11, 21
_NEWER_OPSETS = 2  # opsets past MAX_OPSET read too: their ops braze reads kept their meaning
FOLD_LIMIT = 1 << 16          # numeric folding evaluates tensors up to this many elements
KNOWN_INT_LIMIT = 1024        # integer / bool initializers up to this size stay compile-time
_ONNX_DOMAINS = ("", "ai.onnx")
_SHAPE_READERS = frozenset({"Shape", "Size", "ConstantOfShape", "Range"})  # converters fold
_HOLDS_BODIES = frozenset({"If", "Loop", "Scan"})  # their converters fold (ops/control.py)


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


# AttributeProto.AttributeType -> how to read the value (subgraphs: their GraphProtos)
_ATTRIBUTE_READERS = {
    1: lambda a: a.f, 2: lambda a: a.i, 3: lambda a: _text(a.s), 4: lambda a: a.t,
    5: lambda a: a.g, 6: lambda a: list(a.floats), 7: lambda a: list(a.ints),
    8: lambda a: [_text(s) for s in a.strings], 9: lambda a: list(a.tensors),
    10: lambda a: list(a.graphs), 11: lambda a: a.sparse_tensor,
    12: lambda a: list(a.sparse_tensors),
    13: lambda a: a.tp, 14: lambda a: list(a.type_protos),
}


def SUPPORTED_OPS() -> list[str]:  # noqa: N802 - reads like the constant it is
    return sorted(CONVERTERS)


def import_onnx(model, *, input_shapes: Mapping[str, Sequence] | None = None,
                base_dir: str | os.PathLike | None = None, name: str | None = None,
                mmap: bool | None = None) -> Graph:
    """Import an ONNX model (path, bytes or onnx.ModelProto) as a braze Graph.

    `input_shapes` overrides graph input dims by name (ints or symbol names), e.g. to fix the
    spatial size of a CNN whose file leaves it dynamic. `base_dir` is where external data of a
    bytes / ModelProto model lives. Raises FrontendError (naming the file and node) for anything
    braze cannot import, and UnsupportedOpsError listing every unsupported op type at once.

    Weights are read-only NumPy views of the model's bytes, never copies. Files of 64 MiB or
    more are memory-mapped (`mmap=None`; True / False forces it): rewrite such a file only by
    writing a new one and renaming it over the old, or the imported weights change under you."""
    loaded = load_model(model, base_dir=base_dir, use_mmap=mmap)
    return _Importer(loaded.proto, loaded.source.label, input_shapes or {}, name,
                     loaded.payloads).run()


def converter_key(node: NodeView) -> str:
    """The CONVERTERS key of a node: its op type, or "domain::op_type" outside ONNX's default
    domain (ONNX Runtime's com.microsoft contrib ops, ops/contrib.py)."""
    return node.op_type if node.domain in _ONNX_DOMAINS else f"{node.domain}::{node.op_type}"


_DECIDING = {"Equal": np.equal, "Less": np.less, "Greater": np.greater,  # folds that order
             "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,  # shape values
             "Max": np.maximum, "Min": np.minimum, "Mod": np.mod}


def _deciding(node):
    """The NumPy function of a `_DECIDING` node (Mod with fmod=1 is np.fmod)."""
    if node.op_type == "Mod" and node.attrs.get("fmod", 0):
        return np.fmod
    return _DECIDING[node.op_type]


def _at(k: Known, env: dict[str, int]) -> Known:
    """`k` with its SymDims evaluated under `env`."""
    if not k.symbolic:
        return k
    vals = [eval_dim(SymDim.of(v).to_dim(), env) for v in k.array.reshape(-1)]
    return Known(np.asarray(vals, np.int64).reshape(k.array.shape), k.dtype)


def _sanitize(name: str) -> str:
    s = re.sub(r"\W", "_", name)
    return s if s and s.isidentifier() else f"d_{s}"


def _dim_expression(text: str, plain: set[str]) -> str | None:
    """A dim_param written as a braze dim expression ("batch*seq", "seq+1", as braze's own
    export writes them) as that expression, when feeds can bind it: every symbol but at most
    one is some input's plain dim_param, and that one appears alone and linearly ("2*n+1").
    None otherwise (the dim_param is then an opaque name, as any other)."""
    if not re.fullmatch(r"[\w\s]*[-+*][-+*\w\s]*", text):
        return None
    try:
        p = SymDim.of(text)
    except (ValueError, TypeError):
        return None
    free = p.symbols - plain
    if not p.symbols or len(free) > 1:
        return None
    if free and any(set(m) & free and m != tuple(free) for m in p.terms):
        return None
    return p.to_dim() if isinstance(p.to_dim(), str) else None


class _Importer(SubgraphImports):
    def __init__(self, proto, label: str, input_shapes, name: str | None,
                 payloads: Sequence | None = None):
        self.proto = proto
        self.payloads = list(payloads or [])
        self.label = label
        self.assumed: list[SymDim] = []  # clamps resolved by assumption (frontends.clamps)
        self.input_shapes = dict(input_shapes)
        gp = proto.graph
        self.g = Graph(name or _str(gp.name) or "onnx_model", record_provenance=False)
        self.opset = self._opset()
        self.ctx = ImportContext(self.g, self.opset, label, scopes=self)
        self.in_body = False  # a subgraph's importer: initializers become constants
        self.prefix = ""  # what a subgraph's nodes' provenance starts with

    def _opset(self) -> int:
        version = None
        for o in self.proto.opset_import:
            if o.domain in _ONNX_DOMAINS:
                version = o.version
        if version is None:
            if self.proto.opset_import:
                raise FrontendError(f"{self.label} imports no default-domain ONNX opset")
            version = MAX_OPSET
        if not MIN_OPSET <= version <= MAX_OPSET + _NEWER_OPSETS:
            raise FrontendError(f"{self.label} uses ONNX opset {version}; braze imports opsets "
                                f"{MIN_OPSET}..{MAX_OPSET + _NEWER_OPSETS} (convert it with "
                                "onnx.version_converter)")
        return version

    # -- the import -----------------------------------------------------------------------------
    def run(self) -> Graph:
        gp = self.proto.graph
        self._check_supported(gp.node)
        nodes = self._checked_views(gp)
        init_names = self._initializers(gp)
        self._inputs(gp, init_names)
        guarded = self._read_excludes()
        for node in self._topological(nodes):
            if guarded and is_guard_node(node.name):
                self._skip_guard(node)
                continue
            self._convert(node)
        self._outputs(gp)
        check_assumptions(self.g, self.assumed, self.label)
        return self.g

    def _checked_views(self, gp) -> list[NodeView]:
        nodes = [self._view(n) for n in gp.node]
        for n in nodes:
            n.schema = node_schema(n.op_type, n.domain, self.opset)
            check_node(self.label, n.name, n.op_type, n.inputs, n.outputs, n.attr_types,
                       n.schema)
        return nodes

    def _view(self, n) -> NodeView:
        attrs, types = {}, {}
        for a in n.attribute:
            read = _ATTRIBUTE_READERS.get(a.type)
            if read is None:
                raise FrontendError(f"{self.label}: node {_str(n.name) or _str(n.op_type)!r} "
                                    f"({_str(n.op_type)}) has attribute {_str(a.name)!r} of "
                                    f"unknown type {a.type}")
            attrs[_str(a.name)] = read(a)
            types[_str(a.name)] = a.type
        return NodeView(_str(n.op_type), _str(n.name), [_str(x) for x in n.input],
                        [_str(x) for x in n.output], attrs, _str(n.domain), types,
                        captures=node_captures(n))

    def _check_supported(self, node_protos) -> None:
        """UnsupportedOpsError listing every op type braze lacks, subgraphs included."""
        bad: dict[str, str] = {}
        stack = [node_protos]
        while stack:
            for p in stack.pop():
                key = converter_key(NodeView(_str(p.op_type), "", [], [], {}, _str(p.domain)))
                if key not in CONVERTERS and key not in bad:
                    bad[key] = _str(p.name) or (_str(p.output[0]) if p.output else "?")
                stack.extend(sub.node for sub in node_subgraphs(p))
        if bad:
            listing = ", ".join(f"{k} (e.g. node {v!r})" for k, v in sorted(bad.items()))
            raise UnsupportedOpsError(
                f"{self.label}: braze cannot import {len(bad)} op type(s): {listing}. Supported "
                f"ONNX ops: {', '.join(SUPPORTED_OPS())}", bad)

    def _initializers(self, gp) -> set[str]:
        if gp.sparse_initializer:
            sparse = [_str(t.values.name) for t in gp.sparse_initializer]
            raise FrontendError(f"{self.label}: initializer(s) {sparse} are sparse "
                                "(graph.sparse_initializer), which braze does not import; store "
                                "them as dense initializers")
        names = set()
        for i, t in enumerate(gp.initializer):
            name = _str(t.name)
            if name in names:
                raise FrontendError(f"{self.label}: initializer {name!r} is defined twice")
            names.add(name)
            dt = onnx_dtype(t.data_type, f"{self.label}: initializer {name!r}")
            payload = self.payloads[i] if i < len(self.payloads) else None
            self._add_tensor(name, self._tensor_array(t, dt, payload))
        return names

    def _tensor_array(self, t, dt, payload) -> np.ndarray:
        """The initializer's values: a view of its raw bytes (no copy) or, for tensors that
        store typed fields, onnx's conversion."""
        if payload is None:
            return tensor_array(t, f"{self.label}: initializer {t.name!r}")[0]
        dims = tuple(t.dims)
        if any(d < 0 for d in dims) or t.HasField("segment"):
            raise FrontendError(f"{self.label}: initializer {t.name!r} is corrupt (dims {dims}"
                                f"{', segmented' if t.HasField('segment') else ''})")
        n = math.prod(dims)
        if len(payload) != n * dt.itemsize:
            raise FrontendError(f"{self.label}: initializer {t.name!r} is corrupt: {dt}"
                                f"{list(dims)} needs {n * dt.itemsize} bytes, its data has "
                                f"{len(payload)} (truncated file?)")
        arr = np.frombuffer(payload, dtype=dt.np, count=n).reshape(dims)
        return arr.byteswap() if sys.byteorder == "big" else arr  # ONNX stores little-endian

    def _add_tensor(self, name: str, arr: np.ndarray) -> None:
        """A weight (param with stored value) or a compile-time constant, by size and type."""
        dt = braze_dtype(arr.dtype)
        if arr.size == 1 or (not dt.is_float and arr.size <= KNOWN_INT_LIMIT):
            self.ctx.env[name] = Tensor(known=Known(arr, dt))
            return
        if self.in_body:  # a body reads only its inputs and constants
            self.ctx.env[name] = Tensor(value=self.g.constant(np.asarray(arr), dt))
            return
        with self.g.provenance_scope(name):
            v = self.g.param(name, Shape(arr.shape, dt), value=arr)
        self.ctx.env[name] = Tensor(value=v)

    def _inputs(self, gp, init_names: set[str]) -> None:
        seen = set()
        self.plain_dims = {_str(d.dim_param) for vi in gp.input
                           for d in vi.type.tensor_type.shape.dim
                           if d.HasField("dim_param") and _str(d.dim_param).isidentifier()}
        self.plain_dims |= {d for dims in self.input_shapes.values() for d in dims
                            if isinstance(d, str) and d.isidentifier()}
        for vi in gp.input:
            name = _str(vi.name)
            if name in init_names:
                continue  # IR < 4 lists initializers as inputs too
            if name in seen:
                raise FrontendError(f"{self.label}: graph input {name!r} is declared twice")
            seen.add(name)
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                raise FrontendError(f"{self.label}: graph input {name!r} is not a tensor "
                                    "(sequences and maps are not supported)")
            dt = onnx_dtype(tt.elem_type, f"{self.label}: graph input {name!r}")
            dims = self._input_dims(name, tt)
            with self.g.provenance_scope(f"input {name}"):
                v = self.g.input(name, Shape(dims, dt))
            self.ctx.env[name] = Tensor(value=v)
        unknown = set(self.input_shapes) - seen
        if unknown:
            raise FrontendError(f"{self.label}: input_shapes names {sorted(unknown)}, which are "
                                f"not graph inputs (inputs: {sorted(seen)})")

    def _read_excludes(self) -> bool:
        """Put the exclusions a braze export recorded (metadata `EXCLUDES_KEY`) back on the
        inputs; True when there are some (the model's guard nodes are then dropped). An
        exclusion naming symbols the input no longer has (input_shapes fixed them) is left out:
        the binding is then static and is checked by the caller's choice of shape."""
        text = next((_str(p.value) for p in self.proto.metadata_props
                     if _str(p.key) == EXCLUDES_KEY), None)
        if text is None:
            return False
        for name, rules in decode_excludes(text, self.label).items():
            for nid in self.g.input_ids:
                op = self.g.nodes[nid].op
                have = {s for d in op.shape.dims for s in SymDim.of(d).symbols}
                kept = tuple(r for r in rules if SymDim.of(r[0]).symbols <= have
                             and not isinstance(r[0], int) and r not in op.excludes)
                if op.name == name and kept:
                    self.g.nodes[nid] = replace(self.g.nodes[nid],
                                                op=replace(op, excludes=op.excludes + kept))
                    self.g.edits += 1
        return True

    def _skip_guard(self, node: NodeView) -> None:
        """Drop a guard node of braze's export; its pass-through of an output y is y."""
        if node.name.startswith(PASS_PREFIX) and node.op_type == "Reshape":
            self.ctx.env[node.outputs[0]] = self.ctx.env[node.inputs[0]]

    def _input_dims(self, name: str, tt) -> tuple:
        if name in self.input_shapes:
            dims = tuple(self.input_shapes[name])
            if tt.HasField("shape") and len(tt.shape.dim) != len(dims):
                raise FrontendError(f"{self.label}: input_shapes gives {name!r} rank {len(dims)} "
                                    f"but the model declares rank {len(tt.shape.dim)}")
            return dims
        if not tt.HasField("shape"):
            raise FrontendError(f"{self.label}: graph input {name!r} has no declared rank; "
                                "pass input_shapes={...} to import_onnx")
        dims = []
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param and d.dim_param != "?":
                text = _str(d.dim_param)
                dims.append(_dim_expression(text, self.plain_dims) or _sanitize(text))
            else:
                dims.append(f"{_sanitize(name)}_dim{axis}")
        return tuple(dims)

    def _topological(self, nodes: list[NodeView]) -> list[NodeView]:
        """The nodes in an order where each reads only earlier results (ONNX requires it; a
        model that breaks it is sorted), or an error naming a cycle / dangling input."""
        produced: dict[str, int] = {}
        for i, n in enumerate(nodes):
            for o in n.outputs:
                if not o:
                    continue
                if o in produced or o in self.ctx.env:
                    raise FrontendError(f"{self.label}: tensor {o!r} is produced twice (by node "
                                        f"{n.label}); output names must be unique")
                produced[o] = i
        available = set(self.ctx.env)
        if all(all(not x or x in available or produced.get(x, len(nodes)) < i
                   for x in n.reads) for i, n in enumerate(nodes)):
            for n in nodes:
                self._check_inputs(n, available, produced)
            return nodes
        order, state = [], [0] * len(nodes)  # 0 new, 1 visiting, 2 done

        def visit(i: int) -> None:
            stack = [(i, iter(nodes[i].reads))]
            state[i] = 1
            while stack:
                j, it = stack[-1]
                for x in it:
                    if not x or x in available:
                        continue
                    k = produced.get(x)
                    if k is None:
                        raise FrontendError(f"{self.label}: node {nodes[j].label} reads {x!r}, "
                                            "which no graph input, initializer or node produces")
                    if state[k] == 1:
                        raise FrontendError(f"{self.label}: the graph has a cycle through node "
                                            f"{nodes[k].label} (reading {x!r})")
                    if state[k] == 0:
                        state[k] = 1
                        stack.append((k, iter(nodes[k].reads)))
                        break
                else:
                    stack.pop()
                    state[j] = 2
                    order.append(nodes[j])

        for i in range(len(nodes)):
            if state[i] == 0:
                visit(i)
        return order

    def _check_inputs(self, n: NodeView, available, produced) -> None:
        for x in n.reads:
            if x and x not in available and x not in produced:
                raise FrontendError(f"{self.label}: node {n.label} reads {x!r}, which no graph "
                                    "input, initializer or node produces")

    # -- one node -------------------------------------------------------------------------------
    def _symbols_hint(self, e: BrazeError) -> str:
        """For a shape error over symbolic dims where several inputs have their own symbols
        (the dynamo exporter names input_ids' and attention_mask's dims apart): how to say
        which are equal."""
        named = [(n.op.name, n.outputs[0].dims) for n in self.g.inputs
                 if any(not isinstance(d, int) for d in n.outputs[0].dims)]
        if "symbol" not in str(e) or len(named) < 2:
            return ""
        have = ", ".join(f"{name} {tuple(str(d) for d in dims)}" for name, dims in named)
        return (f"; if some of these inputs' dims are equal ({have}), give them one name: "
                f"import_onnx(..., input_shapes={{{named[0][0]!r}: ('batch', 'seq'), ...}}), "
                "or an expression for a dim that is a sum (a KV cache's mask: 'past+seq')")

    def _convert(self, node: NodeView) -> None:
        ctx = self.ctx
        prov = self.prefix + (node.name or
                              f"{node.op_type}:{node.outputs[0] if node.outputs else '?'}")
        if node.schema is not None:
            check_input_types(self.label, node.name, node.op_type, node.inputs,
                              self._input_dtypes(node), node.schema)
        try:
            with self.g.provenance_scope(prov):
                outs = self._fold(node)
                if outs is None:
                    outs = CONVERTERS[converter_key(node)](ctx, node)
        except FrontendError:
            raise
        except BrazeError as e:
            raise FrontendError(f"{self.label}: node {node.label}: {e}{self._symbols_hint(e)}") \
                from e
        except NotFoldable as e:
            raise FrontendError(f"{self.label}: node {node.label}: {e}") from e
        except (ValueError, TypeError, KeyError, IndexError) as e:
            raise FrontendError(f"{self.label}: node {node.label} could not be imported "
                                f"({type(e).__name__}: {e}); check its inputs and attributes") \
                from e
        outs = list(outs)
        if len(outs) < len([o for o in node.outputs if o]):
            raise FrontendError(f"{self.label}: node {node.label} has {len(node.outputs)} "
                                f"outputs; braze computes only {len(outs)} (the extra outputs "
                                "are not supported)")
        for name, out in zip(node.outputs, outs):
            if not name:
                continue
            if isinstance(out, Known):
                ctx.env[name] = Tensor(known=out)
            elif isinstance(out, Value):
                ctx.env[name] = Tensor(value=out)
            elif out is None:
                raise FrontendError(f"{self.label}: node {node.label}: output {name!r} is not "
                                    "supported by braze (only the main output is)")
            else:
                raise TypeError(f"converter for {node.op_type} returned {out!r}")

    def _input_dtypes(self, node: NodeView) -> list:
        env, out = self.ctx.env, []
        for x in node.inputs:
            t = env.get(x) if x else None
            if t is None:
                out.append(None)
            elif t.known is not None:
                out.append(t.known.dtype)
            else:
                out.append(self.g.shape_of(t.value).dtype)
        return out

    def _fold(self, node: NodeView) -> list[Known] | None:
        """Compile-time results when every input is known (symbolic shape math, or small
        numeric tensors evaluated with the reference interpreter); None otherwise."""
        op = node.op_type
        if op in _SHAPE_READERS or op in _HOLDS_BODIES:
            return None  # their converters decide (they read shapes, not values; subgraphs)
        env = self.ctx.env
        ins: list[Known | None] = []
        for x in node.inputs:
            if not x:
                ins.append(None)
                continue
            t = env.get(x)
            if t is None or t.known is None:  # computed at run time
                if op == "CastLike" and len(ins) == 1 and ins[0] is not None:
                    return self._cast_like(node, ins[0])  # reads only input 1's dtype
                return None
            ins.append(t.known)
        present = [k for k in ins if k is not None]
        if not present:
            return None
        if op == "CastLike" and len(ins) > 1:
            return self._cast_like(node, ins[0])
        fold = FOLDERS.get(converter_key(node))
        if fold is not None:
            try:
                with np.errstate(all="ignore"):  # IEEE results (T5's log(0) = -inf), silently
                    out = fold(node.attrs, ins, self.opset)
                if op in _DECIDING:
                    self._exclude_small(node, ins, out)
                return out
            except (NotFoldable, ValueError, TypeError, IndexError, AttributeError):
                if op in ("Max", "Min") and len(present) == 2 and all(k.symbolic or
                                                                     k.dtype.is_int
                                                                     for k in present):
                    return self._assumed_clamp(op == "Max", present)
                # otherwise computed at run time instead
        if any(k.symbolic for k in present):
            return None
        if sum(k.array.size for k in present) > FOLD_LIMIT:
            return None
        with np.errstate(all="ignore"):
            return self._evaluate(node, present)

    def _exclude_small(self, node, ins: list[Known | None], out: list[Known]) -> None:
        """A comparison / Max / Min / Mod of shape values folded for symbols >= 2 (N == 1 is
        False, max(N, 1) is N, fmod(2*N - 1, 2) is 1): each symbol at 0 and 1 (the others at
        2) that folds otherwise is an excluded binding of the input naming it
        (`ImportContext.exclude_small`)."""
        syms = {s for k in ins if k is not None and k.symbolic
                for v in k.array.reshape(-1) for s in SymDim.of(v).symbols}
        fn = _deciding(node)

        def holds(env):
            args = [_at(k, env).array for k in ins if k is not None]
            want = args[0]
            for a in args[1:]:
                want = fn(want, a)
            return np.array_equal(_at(out[0], env).array, want)

        self.ctx.exclude_small(node, syms, holds,
                               f"{node.op_type} of shape values was decided for {{sym}} >= "
                               f"{MIN_SYMBOL_VALUE} and differs at {{sym}} = {{value}}; feed "
                               "another size, or fix {sym} with input_shapes=")

    def _assumed_clamp(self, is_max: bool, ins: list[Known]) -> list[Known] | None:
        """Max / Min of shape values that no binding orders (MPT's max(0, 64 - seq)): the
        symbolic side, with its requirement recorded (braze.frontends.clamps) and checked
        against the graph's dynamic_narrows at the end of the import."""
        needs: list[SymDim] = []

        def pick(x, y):
            try:
                return FOLDERS_PICK[is_max](x, y)
            except NotFoldable:
                choice = clamp_choice(SymDim.of(x), SymDim.of(y), is_max)
                if choice is None:
                    raise
                needs.append(choice[1])
                return choice[0]

        try:
            out = np.frompyfunc(pick, 2, 1)(ins[0].array, ins[1].array)
        except NotFoldable:
            return None
        self.assumed.extend(n for n in needs if n not in self.assumed)
        return [Known(np.asarray(out, dtype=object), ins[0].dtype)]

    def _cast_like(self, node: NodeView, k: Known) -> list[Known] | None:
        """CastLike of a compile-time value: a compile-time value of input 1's dtype."""
        like = self.ctx.tensor(node, 1)
        dt = like.known.dtype if like.known is not None else self.ctx.dtype(like.value)
        if k.symbolic:
            return [Known(k.array, dt)] if dt.is_int or dt.is_float else None
        return [Known(np.asarray(k.array).astype(dt.np), dt)]

    def _evaluate(self, node: NodeView, present: list[Known]) -> list[Known] | None:
        scratch = Graph("fold", record_provenance=False)
        sctx = ImportContext(scratch, self.opset, self.label)
        for i, x in enumerate(node.inputs):
            if self.ctx.has(node, i):
                sctx.env[x] = Tensor(known=self.ctx.env[x].known)
        try:
            outs = CONVERTERS[converter_key(node)](sctx, node)
            vals = [sctx.materialize(o) if isinstance(o, Known) else o for o in outs]
            if any(not isinstance(v, Value) for v in vals):
                return None
            scratch.set_outputs(vals)
            arrays = interpret(scratch, {})
        except (BrazeError, ValueError, TypeError, KeyError, IndexError, NotFoldable):
            return None
        return [Known(a, braze_dtype(a.dtype)) for a in arrays]

    def _outputs(self, gp) -> None:
        """The graph's outputs in ONNX's order. A name listed twice (TorchScript exports of a
        module that returns one tensor twice) is one braze value returned twice: braze graphs
        allow repeated outputs (the fusion pipeline's cleanup makes them too), the executor
        returns a separate array per position and the exporter a separate named output."""
        outs = []
        for vi in gp.output:
            name = _str(vi.name)
            t = self.ctx.env.get(name)
            if t is None:
                raise FrontendError(f"{self.label}: graph output {name!r} is not produced by "
                                    "any node, input or initializer")
            if t.value is None:
                t.value = self.ctx.materialize(t.known)
            outs.append(t.value)
        if not outs:
            raise FrontendError(f"{self.label} declares no graph outputs")
        self.g.set_outputs(outs)
