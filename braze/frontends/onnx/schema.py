"""Checking ONNX nodes against ONNX's own operator schemas (onnx.defs) before converting them:
input and output counts, required inputs, attribute types, required and unknown attributes
(structure, `check_node`), and the element types of the inputs against the schema's type
constraints (`check_input_types`). A malformed node is a FrontendError naming the node and what
ONNX expects; converters can then rely on attributes having their declared types.

Ops outside ONNX's default domain (ONNX Runtime's contrib ops) have no schema here; their
converters validate their own inputs."""
from __future__ import annotations

from collections.abc import Sequence

from ...errors import FrontendError
from ...ir.dtypes import DType

__all__ = ["node_schema", "check_node", "check_input_types"]

_SCHEMAS: dict[tuple[str, str, int], object] = {}
_ATTR_TYPE_NAMES = {1: "FLOAT", 2: "INT", 3: "STRING", 4: "TENSOR", 5: "GRAPH", 6: "FLOATS",
                    7: "INTS", 8: "STRINGS", 9: "TENSORS", 10: "GRAPHS", 11: "SPARSE_TENSOR",
                    12: "SPARSE_TENSORS", 13: "TYPE_PROTO", 14: "TYPE_PROTOS"}
_ONNX_TYPE = {"f32": "float", "f16": "float16", "bf16": "bfloat16", "f64": "double",
              "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8",
              "u32": "uint32", "bool": "bool", "c64": "complex64"}


def node_schema(op_type: str, domain: str, opset: int):
    """ONNX's schema of `op_type` at `opset` (default domain), or None."""
    key = (op_type, domain, opset)
    if key not in _SCHEMAS:
        schema = None
        if domain in ("", "ai.onnx"):
            from onnx import defs

            try:
                schema = defs.get_schema(op_type, opset, "")
            except Exception:  # noqa: BLE001 - SchemaError: not an ONNX op at this opset
                schema = None
        _SCHEMAS[key] = schema
    return _SCHEMAS[key]


def _who(label: str, name: str, op_type: str) -> str:
    return f"{label}: node {name or '<unnamed>'!r} ({op_type})"


def check_node(label: str, name: str, op_type: str, inputs: Sequence[str],
               outputs: Sequence[str], attr_types: dict[str, int], schema) -> None:
    """FrontendError when the node's arity or attributes contradict its schema."""
    if schema is None:
        return
    who = _who(label, name, op_type)
    spec = f"ONNX's {op_type}-{schema.since_version}"
    n_in = len(inputs)
    while n_in and not inputs[n_in - 1]:
        n_in -= 1  # trailing omitted optional inputs
    if not schema.min_input <= n_in <= schema.max_input:
        raise FrontendError(f"{who} has {n_in} inputs; {spec} takes {_range(schema, 'input')}")
    optional = _optional_positions(schema)
    for i in range(n_in):
        if not inputs[i] and i not in optional:
            raise FrontendError(f"{who}: input {i} ({_formal_name(schema, i)}) is required "
                                "but left empty")
    n_out = len(outputs)
    if n_out > schema.max_output or not any(outputs):
        raise FrontendError(f"{who} has {n_out} outputs; {spec} produces "
                            f"{_range(schema, 'output')}")
    declared = schema.attributes
    for key, kind in attr_types.items():
        a = declared.get(key)
        if a is None:
            known = ", ".join(sorted(declared)) or "none"
            raise FrontendError(f"{who} has attribute {key!r}, which {spec} does not define "
                                f"(its attributes: {known})")
        if int(a.type) != kind:
            raise FrontendError(f"{who}: attribute {key!r} is {_ATTR_TYPE_NAMES.get(kind, kind)}"
                                f"; {spec} declares it {_ATTR_TYPE_NAMES.get(int(a.type))}")
    for key, a in declared.items():
        if a.required and key not in attr_types:
            raise FrontendError(f"{who} lacks the required attribute {key!r}")


def check_input_types(label: str, name: str, op_type: str, inputs: Sequence[str],
                      dtypes: Sequence[DType | None], schema) -> None:
    """FrontendError when an input's element type is not one the schema allows there, or two
    inputs that share a type variable differ."""
    if schema is None:
        return
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    formals = list(schema.inputs)
    bound: dict[str, tuple[int, str]] = {}
    for i, dt in enumerate(dtypes):
        if dt is None or not formals:
            continue
        formal = formals[min(i, len(formals) - 1)]
        if i >= len(formals) and formal.option != formal.option.Variadic:
            continue
        t = f"tensor({_ONNX_TYPE[dt.name]})"
        var = formal.type_str
        if var in allowed:
            if t not in allowed[var]:
                raise FrontendError(f"{_who(label, name, op_type)}: input {i} "
                                    f"({inputs[i]!r}) is {t}; ONNX's {op_type}-"
                                    f"{schema.since_version} takes "
                                    f"{_types(allowed[var])} there")
            homogeneous = formal.option != formal.option.Variadic or formal.is_homogeneous
            if homogeneous:
                first = bound.setdefault(var, (i, t))
                if first[1] != t:
                    raise FrontendError(f"{_who(label, name, op_type)}: inputs {first[0]} and "
                                        f"{i} must have the same type ({var}), got {first[1]} "
                                        f"and {t}")
        elif var.startswith("tensor(") and t != var:
            raise FrontendError(f"{_who(label, name, op_type)}: input {i} ({inputs[i]!r}) is "
                                f"{t}; ONNX's {op_type}-{schema.since_version} takes {var} "
                                "there")


def _optional_positions(schema) -> set[int]:
    out = set()
    for i, f in enumerate(schema.inputs):
        if f.option == f.option.Optional:
            out.add(i)
    return out


def _formal_name(schema, i: int) -> str:
    formals = list(schema.inputs)
    return formals[min(i, len(formals) - 1)].name if formals else "?"


def _range(schema, what: str) -> str:
    lo, hi = getattr(schema, f"min_{what}"), getattr(schema, f"max_{what}")
    if lo == hi:
        return f"{lo}"
    return f"{lo} or more" if hi > 1000 else f"{lo} to {hi}"


def _types(types) -> str:
    names = sorted(t[len("tensor("):-1] for t in types if t.startswith("tensor("))
    return ", ".join(names) if len(names) <= 8 else ", ".join(names[:8]) + ", ..."
