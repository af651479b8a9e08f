"""Generic codec for op attributes, driven by each op class's dataclass fields and type hints.

`encode_attrs(op)` gives a JSON-able dict; `decode_op(kind, attrs)` rebuilds the op. The text IR
reuses `decode_value`, so both formats accept exactly the same attribute types: int, float,
bool, str, None-able versions, Enum, DType, Shape, (nested) tuples, np.ndarray, Graph and Op."""
from __future__ import annotations

import base64
import dataclasses
import enum
import sys
import types
import typing
from functools import cache
from typing import Any

import numpy as np

from ..errors import ParseError
from .dtypes import DType, dtype_from_name, dtype_from_numpy
from .op import OP_REGISTRY, Op
from .shapes import Dim, Shape
from .symbolic import canonical_dim

__all__ = [
    "encode_attrs", "encode_value", "decode_op", "decode_value", "op_fields", "op_head",
    "resolve_head", "encode_array", "decode_array", "OpLiteral", "graph_fields",
]

RESERVED_WORDS = frozenset({"true", "false", "none", "inf", "nan", "graph", "params", "return",
                            "input", "param"})


@dataclasses.dataclass(frozen=True)
class OpLiteral:
    """An op written as `head[attr=value, ...]` in text IR, not yet resolved to a class."""

    head: str
    attrs: dict


class _DecodeError(Exception):
    """Internal: a value does not fit its hint; turned into a ParseError naming kind and field."""


# -- field metadata ----------------------------------------------------------------------------
def _localns() -> dict[str, Any]:
    from .graph import Graph

    return {"Graph": Graph, "Op": Op, "Shape": Shape, "DType": DType, "Dim": Dim, "np": np,
            "Any": Any}


@cache
def op_fields(cls: type) -> tuple[tuple[str, Any, Any], ...]:
    """(name, type hint, default or MISSING) for each init field of an op class."""
    module = sys.modules.get(cls.__module__)
    globalns = dict(vars(module)) if module else {}
    try:
        hints = typing.get_type_hints(cls, globalns=globalns, localns=_localns())
    except Exception:  # an unresolvable annotation: resolve field by field below
        hints = {}
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        hint = hints.get(f.name)
        if hint is None:
            hint = _eval_hint(f.type, globalns)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        out.append((f.name, hint, default))
    return tuple(out)


def _eval_hint(annotation, globalns: dict) -> Any:
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, globalns, _localns())  # noqa: S307 - annotations of our own ops
    except Exception:
        return Any


def _mentions(hint, target: type) -> bool:
    if isinstance(hint, type) and issubclass(hint, target):
        return True
    return any(_mentions(a, target) for a in typing.get_args(hint) if a is not Ellipsis)


@cache
def graph_fields(cls: type) -> tuple[str, ...]:
    """Names of the fields of an op class whose type mentions Graph (region bodies)."""
    from .graph import Graph

    return tuple(name for name, hint, _ in op_fields(cls) if _mentions(hint, Graph))


# -- encoding (value-driven) --------------------------------------------------------------------
def encode_attrs(op: Op) -> dict:
    """The op's attributes as a JSON-able dict (field name -> plain value)."""
    return {name: encode_value(getattr(op, name)) for name, _, _ in op_fields(type(op))}


def encode_value(v: Any) -> Any:
    """A JSON-able form of one attribute value (see `decode_value` for the inverse)."""
    from .graph import Graph

    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, DType):
        return v.name
    if isinstance(v, Shape):
        return str(v)
    if isinstance(v, (tuple, list)):
        return [encode_value(x) for x in v]
    if isinstance(v, np.ndarray):
        return encode_array(v)
    if isinstance(v, Graph):
        from .serialize import graph_to_dict

        return graph_to_dict(v, inline_weights=True)
    if isinstance(v, Op):
        return {"kind": v.kind, "attrs": encode_attrs(v)}
    raise TypeError(f"cannot encode attribute value {v!r} of type {type(v).__name__}")


def encode_array(a: np.ndarray) -> dict:
    """{"dtype", "shape", "b64"}: the raw bytes (C order, little-endian platforms)."""
    dt = dtype_from_numpy(a.dtype)
    raw = np.ascontiguousarray(a).tobytes()
    return {"dtype": dt.name, "shape": list(a.shape), "b64": base64.b64encode(raw).decode()}


def decode_array(d: Any) -> np.ndarray:
    """Inverse of `encode_array`; raises ValueError on malformed data."""
    if isinstance(d, np.ndarray):
        return d
    if not isinstance(d, dict) or set(d) != {"dtype", "shape", "b64"}:
        raise ValueError("an array must be {dtype, shape, b64}")
    dt = dtype_from_name(d["dtype"])
    shape = d["shape"]
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise ValueError(f"bad array shape {shape!r}")
    raw = base64.b64decode(d["b64"], validate=True)
    n = int(np.prod(shape, dtype=np.int64))
    if len(raw) != n * dt.itemsize:
        raise ValueError(f"array data has {len(raw)} bytes, {dt}{shape} needs {n * dt.itemsize}")
    return np.frombuffer(raw, dtype=dt.np).reshape(shape).copy()


# -- decoding (hint-driven) ---------------------------------------------------------------------
def decode_op(kind: str, attrs: dict, *, preset: dict | None = None) -> Op:
    """Build the op registered as `kind` from plain attribute values.

    Raises ParseError naming the kind and field on an unknown kind, a missing or unknown field, or
    a value that does not fit the field's type."""
    from .op import op_class

    try:
        cls = op_class(kind)
    except Exception:
        known = ", ".join(sorted(OP_REGISTRY))
        raise ParseError(f"unknown op kind {kind!r} (known kinds: {known})") from None
    if not isinstance(attrs, dict):
        raise ParseError(f"{kind}: attributes must be a mapping, got {type(attrs).__name__}")
    fields = op_fields(cls)
    names = {name for name, _, _ in fields}
    extra = sorted(set(attrs) - names)
    if extra:
        have = ", ".join(sorted(names)) or "none"
        raise ParseError(f"{kind}: unknown attribute {extra[0]!r} (its attributes: {have})")
    kwargs = dict(preset or {})
    for name, hint, default in fields:
        if name in kwargs:
            continue
        if name not in attrs:
            if default is dataclasses.MISSING:
                raise ParseError(f"{kind}: missing attribute {name!r}")
            continue
        try:
            kwargs[name] = decode_value(attrs[name], hint)
        except _DecodeError as e:
            raise ParseError(f"{kind}: attribute {name!r}: {e}") from None
        except ParseError as e:
            raise ParseError(f"{kind}: attribute {name!r}: {e}") from None
    try:
        return cls(**kwargs)
    except ParseError:
        raise
    except Exception as e:
        raise ParseError(f"{kind}: invalid attributes ({type(e).__name__}: {e})") from None


def decode_value(v: Any, hint: Any) -> Any:
    """Turn a plain (JSON or text IR) value into the type `hint` names; _DecodeError if not."""
    from .graph import Graph

    if hint is Any or hint is object:
        return _plain(v)
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return _decode_union(v, typing.get_args(hint))
    if origin is typing.Literal:
        if v in typing.get_args(hint):
            return v
        raise _DecodeError(f"{v!r} is not one of {typing.get_args(hint)}")
    if origin is tuple or hint is tuple:
        return _decode_tuple(v, typing.get_args(hint))
    if origin is typing.ClassVar:
        return decode_value(v, typing.get_args(hint)[0])
    if hint is type(None):
        if v is None:
            return None
        raise _DecodeError(f"expected none, got {v!r}")
    if hint is bool:
        if isinstance(v, bool):
            return v
        raise _DecodeError(f"expected true/false, got {v!r}")
    if hint is int:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        raise _DecodeError(f"expected an int, got {v!r}")
    if hint is float:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        raise _DecodeError(f"expected a number, got {v!r}")
    if hint is str:
        if isinstance(v, str):
            return v
        raise _DecodeError(f"expected a string, got {v!r}")
    if isinstance(hint, type):
        return _decode_class(v, hint, Graph)
    return _plain(v)


def _decode_class(v: Any, hint: type, graph_cls: type) -> Any:
    if isinstance(v, hint):
        return v
    if issubclass(hint, enum.Enum):
        try:
            m = hint(v)
            if type(m.value) is type(v):
                return m
        except (ValueError, TypeError):
            pass
        if isinstance(v, str) and v in hint.__members__:
            return hint.__members__[v]
        known = ", ".join(str(m.value) for m in hint)
        raise _DecodeError(f"unknown {hint.__name__} {v!r} (known: {known})")
    if hint is DType:
        try:
            return dtype_from_name(v)
        except (ValueError, TypeError):
            raise _DecodeError(f"unknown dtype {v!r}") from None
    if hint is Shape:
        if isinstance(v, str):
            return parse_shape_text(v)
        raise _DecodeError(f"expected a type such as f32[2, seq], got {v!r}")
    if issubclass(hint, np.ndarray):
        try:
            return decode_array(v)
        except (ValueError, TypeError, KeyError) as e:
            raise _DecodeError(f"bad array: {e}") from None
    if issubclass(hint, graph_cls):
        if isinstance(v, dict):
            from .serialize import graph_from_dict

            return graph_from_dict(v)
        raise _DecodeError(f"expected a graph, got {type(v).__name__}")
    if issubclass(hint, Op):
        op = _decode_op_value(v)
        if not isinstance(op, hint):
            raise _DecodeError(f"expected a {hint.__name__} op, got {op.kind}")
        return op
    raise _DecodeError(f"no decoder for attribute type {hint.__name__}")


def _decode_op_value(v: Any) -> Op:
    if isinstance(v, Op):
        return v
    if isinstance(v, str):
        v = OpLiteral(v, {})
    if isinstance(v, OpLiteral):
        kind, preset = resolve_head(v.head)
        return decode_op(kind, v.attrs, preset=preset)
    if isinstance(v, dict) and set(v) == {"kind", "attrs"}:
        return decode_op(v["kind"], v["attrs"])
    raise _DecodeError(f"expected an op, got {v!r}")


def _decode_union(v: Any, args: tuple) -> Any:
    if v is None and type(None) in args:
        return None
    errors = []
    for a in args:
        if a is type(None):
            continue
        try:
            return decode_value(v, a)
        except _DecodeError as e:
            errors.append(str(e))
    raise _DecodeError(" / ".join(errors) or f"{v!r} fits none of {args}")


def _decode_tuple(v: Any, args: tuple) -> tuple:
    if not isinstance(v, (list, tuple)):
        raise _DecodeError(f"expected a tuple, got {v!r}")
    if not args:
        return tuple(_plain(x) for x in v)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(decode_value(x, args[0]) for x in v)
    if len(args) == 1 and args[0] == ():
        args = ()
    if len(v) != len(args):
        raise _DecodeError(f"expected {len(args)} elements, got {len(v)}")
    return tuple(decode_value(x, a) for x, a in zip(v, args))


def _plain(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_plain(x) for x in v)
    return v


def parse_shape_text(text: str) -> Shape:
    """`f32[batch, 384]` -> Shape; _DecodeError when malformed."""
    head, sep, rest = text.partition("[")
    if not sep or not rest.endswith("]"):
        raise _DecodeError(f"expected a type such as f32[2, seq], got {text!r}")
    try:
        dt = dtype_from_name(head.strip())
    except ValueError as e:
        raise _DecodeError(str(e)) from None
    body = rest[:-1].strip()
    dims: list[Dim] = []
    for part in body.split(",") if body else []:
        p = part.strip()
        if p.isdigit():
            dims.append(int(p))
        else:
            try:
                dims.append(canonical_dim(p))
            except ValueError:
                raise _DecodeError(f"bad dim {p!r} in {text!r}") from None
    return Shape(tuple(dims), dt)


# -- op heads in text IR: `gelu(...)` for Unary(fn=GELU) ----------------------------------------
_LABELS: dict[str, list[tuple[type, str, enum.Enum]]] = {}
_LABELS_FOR: list[int] = [-1]


def _label_table() -> dict[str, list[tuple[type, str, enum.Enum]]]:
    """label -> [(class, enum field, member)] for op classes labelled by an enum attribute."""
    from . import ops  # noqa: F401  (registers every kind)

    if _LABELS_FOR[0] == len(OP_REGISTRY):
        return _LABELS
    _LABELS.clear()
    for cls in list(OP_REGISTRY.values()):
        for name, hint, _ in op_fields(cls):
            if isinstance(hint, type) and issubclass(hint, enum.Enum):
                for m in hint:
                    label = _probe_label(cls, name, m)
                    if label is not None and label != cls.kind:
                        _LABELS.setdefault(label, []).append((cls, name, m))
    _LABELS_FOR[0] = len(OP_REGISTRY)
    return _LABELS


def _probe_label(cls: type, field: str, member: enum.Enum) -> str | None:
    """The label an instance of `cls` with `field=member` would have (other fields at their
    defaults), computed without running `__init__`; None when it cannot be told."""
    probe = object.__new__(cls)
    for name, _, default in op_fields(cls):
        value = member if name == field else (None if default is dataclasses.MISSING else default)
        object.__setattr__(probe, name, value)
    try:
        label = probe.label
    except Exception:
        return None
    return label if isinstance(label, str) else None


def _head_usable(label: str) -> bool:
    return (label.isidentifier() and label not in RESERVED_WORDS and label not in OP_REGISTRY
            and len(_label_table().get(label, ())) == 1)


def op_head(op: Op) -> tuple[str, str | None]:
    """(head, field the head stands for): the label when it names the op unambiguously (and so
    `resolve_head` can invert it), else the kind with no field."""
    label = op.label
    if label != op.kind and _head_usable(label):
        cls, field, member = _label_table()[label][0]
        if cls is type(op) and getattr(op, field) is member:
            return label, field
    return op.kind, None


def resolve_head(head: str) -> tuple[str, dict]:
    """(kind, preset attributes) for a text IR op head; ParseError for an unknown head."""
    from . import ops  # noqa: F401

    if head in OP_REGISTRY:
        return head, {}
    if _head_usable(head):
        cls, field, member = _label_table()[head][0]
        return cls.kind, {field: member}
    known = sorted(set(OP_REGISTRY) | {k for k in _label_table() if _head_usable(k)})
    raise ParseError(f"unknown op {head!r} (known: {', '.join(known)})")
