"""The ONNX graph under construction: nodes, initializers and tensor names, plus the symbol
table that turns braze's symbolic dims into int64 tensors computed from the graph inputs'
shapes at run time (Shape -> Gather once per symbol; expressions with Mul / Add)."""
from __future__ import annotations

import numpy as np

from ...errors import BrazeError
from ...frontends.onnx.wire import encode_varint
from ...ir.dtypes import DType
from ...ir.graph import Graph
from ...ir.op import Value
from ...ir.symbolic import SymDim

__all__ = ["OnnxBuilder", "ExportError", "onnx_type"]


class ExportError(BrazeError):
    """A graph that cannot be written as ONNX (names the node and why)."""


_ONNX_TYPES = {"f32": 1, "u8": 2, "i8": 3, "i16": 5, "i32": 6, "i64": 7, "bool": 9, "f16": 10,
               "f64": 11, "u32": 12, "c64": 14, "bf16": 16}


def onnx_type(dt: DType) -> int:
    return _ONNX_TYPES[dt.name]


class OnnxBuilder:
    """Collects ONNX nodes and initializers for one exported graph."""

    def __init__(self, g: Graph, opset: int):
        self.g = g
        self.opset = opset
        self.nodes: list = []
        self.initializers: list = []
        self.names: dict[Value, str] = {}
        self._consts: dict[tuple, str] = {}
        self._count = 0
        self._symbols: dict[str, str] = {}
        self._dims: dict[tuple, str] = {}
        self.domains: set[str] = set()
        # names the graph's inputs and params carry: generated names must not repeat them (a
        # model imported from a braze export has params named like its constants, "const_4")
        self._taken: set[str] = {n.op.name for n in (*g.inputs, *g.params)}
        self._bind_symbols()

    # -- names ----------------------------------------------------------------------------------
    def fresh(self, hint: str = "t") -> str:
        while True:
            self._count += 1
            name = f"{hint}_{self._count}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def unique(self, name: str) -> str:
        """`name`, or `name_1`, `name_2`, ... when a graph input, param or generated tensor
        already has it (a graph output named like an input)."""
        out, k = name, 0
        while out in self._taken:
            k += 1
            out = f"{name}_{k}"
        self._taken.add(out)
        return out

    def name(self, v: Value) -> str:
        return self.names[v]

    # -- nodes and constants --------------------------------------------------------------------
    def op(self, op_type: str, inputs, n_out: int = 1, *, domain: str = "", name_hint=None,
           outputs: list[str] | None = None, **attrs) -> list[str]:
        """Append an ONNX node; returns its output names."""
        from onnx import helper

        outs = outputs or [self.fresh(name_hint or op_type.lower()) for _ in range(n_out)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        node = helper.make_node(op_type, list(inputs), outs, name=self.fresh(op_type),
                                domain=domain or None, **attrs)
        self.nodes.append(node)
        if domain:
            self.domains.add(domain)
        return outs

    def op1(self, op_type: str, *inputs, **kw) -> str:
        return self.op(op_type, inputs, **kw)[0]

    def const(self, value, dtype=None) -> str:
        """An initializer holding `value` (small ones are shared)."""
        arr = np.asarray(value, dtype=dtype)
        key = None
        if arr.size <= 16:
            key = (arr.dtype.str, arr.shape, arr.tobytes())
            if key in self._consts:
                return self._consts[key]
        name = self.fresh("const")
        self.add_initializer(name, arr)
        if key is not None:
            self._consts[key] = name
        return name

    def add_initializer(self, name: str, arr: np.ndarray) -> None:
        """Queue an initializer; `write_initializers` puts them into the model (one copy)."""
        self.initializers.append((name, np.asarray(arr)))

    def initializer_bytes(self) -> int:
        return sum(a.nbytes for _, a in self.initializers)

    def write_initializers(self, graph_proto, data_file=None, location: str = "") -> None:
        """Fill `graph_proto.initializer` in place: raw little-endian data inline, or (with
        `data_file`) tensors over 1 KiB written straight to that file as external data."""
        for name, arr in self.initializers:
            fill_tensor(graph_proto.initializer.add(), name, arr, data_file, location)

    def stream_initializers(self, f) -> None:
        """Append the initializers to a serialized model in the open file `f`, each framed as
        its own small ModelProto holding just graph.initializer = [tensor]: protobuf merges
        repeated occurrences of a message field, so the file parses as one model with every
        weight. Only each tensor's header (name, dims, type) goes through protobuf; the weight
        bytes are written straight from the array (`write_tensor_message`), so no copy of a
        weight is ever made."""
        for name, arr in self.initializers:
            write_tensor_message(f, name, arr)

    # -- symbolic dims --------------------------------------------------------------------------
    def _bind_symbols(self) -> None:
        """Symbol -> (input, axis, k, r): the input's dim `axis` is `k*symbol + r`. A plain
        symbol dim wins; otherwise a multiple form ("400*t", "32*h + 3") gives its symbol."""
        linear = {}
        for node in self.g.inputs:
            for axis, d in enumerate(node.op.shape.dims):
                if not isinstance(d, str):
                    continue
                if d.isidentifier():
                    self._symbols.setdefault(d, (node.op.name, axis, 1, 0))
                    continue
                sd = SymDim.of(d)
                terms = [(m, c) for m, c in sd.terms.items() if m]
                if len(terms) == 1 and len(terms[0][0]) == 1 and terms[0][1] > 0:
                    linear.setdefault(terms[0][0][0], (node.op.name, axis, terms[0][1], sd.const))
        for name, ref in linear.items():
            self._symbols.setdefault(name, ref)

    def _symbol_scalar(self, name: str) -> str:
        ref = self._symbols.get(name)
        if ref is None:
            raise ExportError(f"symbol {name!r} is not a dim of any graph input, so an exported "
                              "model cannot compute it; bind it first (static shapes)")
        if isinstance(ref, str):
            return ref
        inp, axis, k, r = ref
        shape = self.op1("Shape", inp, name_hint=f"shape_{_safe(inp)}")
        out = self.op1("Gather", shape, self.const(np.int64(axis)), axis=0,
                       name_hint=f"sym_{name}")
        if r:
            out = self.op1("Sub", out, self.const(np.int64(r)))
        if k != 1:
            out = self.op1("Div", out, self.const(np.int64(k)))
        self._symbols[name] = out
        return out

    def dim_scalar(self, d) -> str:
        """An int64 scalar tensor holding dim `d` (an int, a symbol or an expression)."""
        if isinstance(d, int):
            return self.const(np.int64(d))
        key = ("scalar", d)
        if key in self._dims:
            return self._dims[key]
        total = None
        for mono, coef in SymDim.of(d).terms.items():
            term = self.const(np.int64(coef)) if coef != 1 or not mono else None
            for s in mono:
                v = self._symbol_scalar(s)
                term = v if term is None else self.op1("Mul", term, v)
            total = term if total is None else self.op1("Add", total, term)
        self._dims[key] = total
        return total

    def dims_tensor(self, dims) -> str:
        """A 1-D int64 tensor holding `dims` (static: an initializer)."""
        dims = tuple(dims)
        if all(isinstance(d, int) for d in dims):
            return self.const(np.asarray(dims, np.int64).reshape(len(dims)))
        if dims in self._dims:
            return self._dims[dims]
        parts = [self.op1("Reshape", self.dim_scalar(d), self.const(np.asarray([1], np.int64)))
                 if not isinstance(d, int) else self.const(np.asarray([d], np.int64))
                 for d in dims]
        out = self.op1("Concat", *parts, axis=0, name_hint="dims")
        self._dims[dims] = out
        return out


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)[:40]


def tensor_type(arr: np.ndarray) -> int:
    """The ONNX TensorProto data type of a NumPy array (bfloat16 included)."""
    from onnx import TensorProto, helper

    if arr.dtype.name == "bfloat16":
        return TensorProto.BFLOAT16
    return helper.np_dtype_to_tensor_dtype(arr.dtype)


def fill_tensor(t, name: str, arr: np.ndarray, data_file=None, location: str = "") -> None:
    """Write `arr` into TensorProto `t`: raw data inline, or (with `data_file`, over 1 KiB)
    appended to that file as external data at a 64-byte aligned offset."""
    from onnx import TensorProto

    t.name = name
    t.dims.extend(arr.shape)
    t.data_type = tensor_type(arr)
    if arr.dtype.name == "bfloat16":
        arr = arr.view(np.uint16)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")
    if data_file is not None and arr.nbytes > 1024:
        pad = (-data_file.tell()) % 64
        data_file.write(b"\0" * pad)
        offset = data_file.tell()
        arr.tofile(data_file)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)),
                           ("length", str(arr.nbytes))):
            e = t.external_data.add()
            e.key, e.value = key, value
    else:
        t.raw_data = arr.tobytes()


_LEN = 2  # protobuf wire type of length-delimited fields
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9


def _field_header(number: int, length: int) -> bytes:
    return encode_varint((number << 3) | _LEN) + encode_varint(length)


def write_tensor_message(f, name: str, arr: np.ndarray) -> None:
    """Write ModelProto{graph: {initializer: [TensorProto name=`name` holding `arr`]}} to
    `f`: the same bytes protobuf would serialize (raw little-endian data), but the data is
    written from the array's own buffer after a small protobuf-serialized header."""
    from onnx import TensorProto

    data = _raw_view(arr)
    if data is None or not data.nbytes:  # nothing to save by framing it ourselves
        from onnx import ModelProto

        m = ModelProto()
        fill_tensor(m.graph.initializer.add(), name, arr)
        f.write(m.SerializeToString())
        return
    t = TensorProto()
    t.name = name
    t.dims.extend(arr.shape)
    t.data_type = tensor_type(arr)
    raw = _field_header(_TENSOR_RAW_DATA, data.nbytes)
    tensor_len = t.ByteSize() + len(raw) + data.nbytes
    init = _field_header(_GRAPH_INITIALIZER, tensor_len)
    f.write(_field_header(_MODEL_GRAPH, len(init) + tensor_len) + init
            + t.SerializeToString() + raw)
    f.write(data)


def _raw_view(arr: np.ndarray) -> memoryview | None:
    """The array's bytes as ONNX stores them (little-endian; bfloat16 as its 16 bits), viewed
    without a copy; None when that needs a copy (non-contiguous or big-endian data)."""
    big = arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not np.little_endian)
    if big or not arr.flags.c_contiguous:
        return None
    if arr.dtype.name == "bfloat16":
        arr = arr.view(np.uint16)
    return memoryview(arr.reshape(-1).view(np.uint8))
