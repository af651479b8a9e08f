"""Checking ONNX nodes against ONNX's own operator schemas (onnx.defs) before converting them:
input and output counts, required inputs, attribute types, required and unknown attributes
(structure, `check_node`), and the element types of the inputs against the schema's type
constraints (`check_input_types`). A malformed node is a FrontendError naming the node and what
ONNX expects; converters can then rely on attributes having their declared types.

Ops outside ONNX's default domain (ONNX Runtime's contrib ops) have no schema here; their
converters validate their own inputs."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

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


class Formal(NamedTuple):
    """One formal input of a schema."""

    name: str
    type_str: str  # a type variable ("T") or a fixed type ("tensor(int64)")
    optional: bool
    variadic: bool
    homogeneous: bool


@dataclass(frozen=True)
class Schema:
    """What the checks read from one onnx.defs.OpSchema, read once per op type and opset:
    each property of an OpSchema builds fresh Python objects, and an import checks hundreds of
    nodes of a few dozen op types."""

    since_version: int
    min_input: int
    max_input: int
    min_output: int
    max_output: int
    formals: tuple[Formal, ...]
    attributes: dict[str, tuple[int, bool]]  # name -> (AttributeProto type, required)
    allowed: dict[str, frozenset[str]]  # type variable -> allowed "tensor(...)" types

    @staticmethod
    def of(schema) -> Schema:
        formals = []
        for f in schema.inputs:
            variadic = f.option == f.option.Variadic
            formals.append(Formal(f.name, f.type_str, f.option == f.option.Optional, variadic,
                                  not variadic or f.is_homogeneous))
        return Schema(
            schema.since_version, schema.min_input, schema.max_input, schema.min_output,
            schema.max_output, tuple(formals),
            {k: (int(a.type), a.required) for k, a in schema.attributes.items()},
            {c.type_param_str: frozenset(c.allowed_type_strs)
             for c in schema.type_constraints})


def node_schema(op_type: str, domain: str, opset: int) -> Schema | None:
    """ONNX's schema of `op_type` at `opset` (default domain), or None."""
    key = (op_type, domain, opset)
    if key not in _SCHEMAS:
        schema = None
        if domain in ("", "ai.onnx"):
            from onnx import defs

            try:
                schema = Schema.of(defs.get_schema(op_type, opset, ""))
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
    formals = schema.formals
    for i in range(n_in):
        if not inputs[i] and not (i < len(formals) and formals[i].optional):
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
        if a[0] != kind:
            raise FrontendError(f"{who}: attribute {key!r} is {_ATTR_TYPE_NAMES.get(kind, kind)}"
                                f"; {spec} declares it {_ATTR_TYPE_NAMES.get(a[0])}")
    for key, (_, required) in declared.items():
        if required and key not in attr_types:
            raise FrontendError(f"{who} lacks the required attribute {key!r}")


def check_input_types(label: str, name: str, op_type: str, inputs: Sequence[str],
                      dtypes: Sequence[DType | None], schema) -> None:
    """FrontendError when an input's element type is not one the schema allows there, or two
    inputs that share a type variable differ."""
    if schema is None:
        return
    allowed, formals = schema.allowed, schema.formals
    bound: dict[str, tuple[int, str]] = {}
    for i, dt in enumerate(dtypes):
        if dt is None or not formals:
            continue
        formal = formals[min(i, len(formals) - 1)]
        if i >= len(formals) and not formal.variadic:
            continue
        t = f"tensor({_ONNX_TYPE[dt.name]})"
        var = formal.type_str
        if var in allowed:
            if t not in allowed[var]:
                raise FrontendError(f"{_who(label, name, op_type)}: input {i} "
                                    f"({inputs[i]!r}) is {t}; ONNX's {op_type}-"
                                    f"{schema.since_version} takes "
                                    f"{_types(allowed[var])} there")
            if formal.homogeneous:
                first = bound.setdefault(var, (i, t))
                if first[1] != t:
                    raise FrontendError(f"{_who(label, name, op_type)}: inputs {first[0]} and "
                                        f"{i} must have the same type ({var}), got {first[1]} "
                                        f"and {t}")
        elif var.startswith("tensor(") and t != var:
            raise FrontendError(f"{_who(label, name, op_type)}: input {i} ({inputs[i]!r}) is "
                                f"{t}; ONNX's {op_type}-{schema.since_version} takes {var} "
                                "there")


def _formal_name(schema: Schema, i: int) -> str:
    formals = schema.formals
    return formals[min(i, len(formals) - 1)].name if formals else "?"


def _range(schema: Schema, what: str) -> str:
    lo, hi = getattr(schema, f"min_{what}"), getattr(schema, f"max_{what}")
    if lo == hi:
        return f"{lo}"
    return f"{lo} or more" if hi > 1000 else f"{lo} to {hi}"


def _types(types) -> str:
    names = sorted(t[len("tensor("):-1] for t in types if t.startswith("tensor("))
    return ", ".join(names) if len(names) <= 8 else ", ".join(names[:8]) + ", ..."
