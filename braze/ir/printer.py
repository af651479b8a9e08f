"""Text IR: `str(graph)`. One line per node, read back exactly by `braze.ir.parser`.

    graph bert_layer(%hidden: f32[batch, seq, 384]) params(%w: f32[384, 1152]) {
      %hidden = input                                            # model.py:3
      %w = param                                                 # model.py:4
      %2 = matmul(%hidden, %w) -> f32[batch, seq, 1152]          # model.py:12
      %3 = gelu(%2) -> f32[batch, seq, 1152]                     # model.py:12
      %4 = split[axis=2, sizes=(576, 576)](%3) -> (f32[batch, seq, 576], f32[batch, seq, 576])
      return %3, %4.1
    }

A value is `%name` (named nodes; quoted as `%"a.b"` when not an identifier) or `%id`, with `.k`
for output k > 0. Ops print as `kind[attr=value, ...]`, or by their label (`gelu`) when that
names them unambiguously; attributes equal to their default are left out. Provenance is the
trailing comment (JSON-quoted when it would not read back verbatim). Inputs and params are
declared in the header (in graph order) and placed in node order by `%x = input` lines.
Constants print inline (`f32[2]{1.0, 2.5}`) when small and as base64 (`f32[64]{"..."}`)
otherwise; both are bit-exact. Region bodies print as nested graphs. Weights are not text IR."""
from __future__ import annotations

import base64
import enum
import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .attrs import RESERVED_WORDS, op_fields, op_head
from .dtypes import DType, dtype_from_numpy
from .node import Node
from .op import Op, Value
from .ops.io import Input, Param
from .shapes import Shape

if TYPE_CHECKING:
    from .graph_core import GraphCore

__all__ = ["print_graph", "format_node", "format_value", "format_ref", "INLINE_ELEMENTS"]

INLINE_ELEMENTS = 16  # constants with more elements print as base64
_COMMENT_COLUMN = 64


def print_graph(g: GraphCore, indent: int = 0) -> str:
    """The text IR of `g` (see the module docstring for the format)."""
    pad = " " * indent
    ins = ", ".join(f"{format_ref(g, Value(i))}: {_type_of(g, i)}" for i in g.input_ids)
    prs = ", ".join(f"{format_ref(g, Value(i))}: {_type_of(g, i)}" for i in g.param_ids)
    lines = [f"{pad}graph {_ident_or_quoted(g.name)}({ins}) params({prs}) {{"]
    declared = set(g.input_ids) | set(g.param_ids)
    for node in g.nodes:
        lines.append(format_node(g, node, indent + 2, declared=declared))
    outs = ", ".join(format_ref(g, v) for v in g.outputs)
    lines.append(f"{pad}  return {outs}".rstrip())
    lines.append(f"{pad}}}")
    return "\n".join(lines)


def format_node(g: GraphCore, node: Node, indent: int = 2, *, declared: set[int] | None = None
                ) -> str:
    """One node as a text IR line (several lines when it holds a region body).

    Works on broken graphs too (unknown values print as `%id`), so errors can quote it."""
    pad = " " * indent
    lhs = format_ref(g, Value(node.id))
    if declared is None:
        declared = set(g.input_ids) | set(g.param_ids)
    if node.id in declared and _is_plain_source(node):
        text = f"{pad}{lhs} = {node.op.kind}"
    else:
        args = ", ".join(format_ref(g, v) for v in node.inputs)
        text = f"{pad}{lhs} = {format_op(node.op, indent)}({args}) -> {_format_types(node.outputs)}"
    return text + _comment(text, node.provenance)


def _is_plain_source(node: Node) -> bool:
    op = node.op
    return (isinstance(op, (Input, Param)) and node.name == op.name and len(node.outputs) == 1
            and node.outputs[0] == op.shape and not node.inputs and not getattr(op, "excludes", ()))


def format_op(op: Op, indent: int = 0) -> str:
    """`head[attr=value, ...]`; attributes equal to their default are left out."""
    head, implied = op_head(op)
    parts = []
    for name, _, default in op_fields(type(op)):
        if name == implied:
            continue
        v = getattr(op, name)
        if _is_default(v, default):
            continue
        parts.append(f"{name}={format_value(v, indent)}")
    return f"{head}[{', '.join(parts)}]" if parts else head


def _is_default(v: Any, default: Any) -> bool:
    simple = (bool, int, float, str, enum.Enum, DType, Shape, tuple, type(None))
    if not isinstance(v, simple) or type(v) is not type(default):
        return False
    try:
        return bool(v == default) and repr(v) == repr(default)
    except Exception:
        return False


def format_value(v: Any, indent: int = 0) -> str:
    """One attribute value in text IR syntax."""
    from .graph_core import GraphCore

    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, enum.Enum):
        return _ident_or_quoted(v.value) if isinstance(v.value, str) else format_value(v.value)
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, DType):
        return v.name
    if isinstance(v, Shape):
        return str(v)
    if isinstance(v, (tuple, list)):
        items = [format_value(x, indent) for x in v]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(v, np.ndarray):
        return format_array(v)
    if isinstance(v, GraphCore):
        return print_graph(v, indent + 2).lstrip()
    if isinstance(v, Op):
        return format_op(v, indent)
    raise TypeError(f"cannot print attribute value {v!r} of type {type(v).__name__}")


def format_array(a: np.ndarray) -> str:
    """`f32[2]{1.0, 2.5}` (small, exact decimal) or `f32[64]{"<base64>"}`."""
    dt = dtype_from_numpy(a.dtype)
    head = str(Shape(a.shape, dt))
    flat = a.reshape(-1)
    if a.size <= INLINE_ELEMENTS and dt.kind != "complex":
        if dt.kind == "bool":
            return head + "{" + ", ".join("true" if x else "false" for x in flat) + "}"
        if dt.is_int:
            return head + "{" + ", ".join(str(int(x)) for x in flat) + "}"
        vals = [float(x) for x in flat]
        if not any(math.isnan(x) for x in vals):  # NaN payloads only survive as raw bytes
            return head + "{" + ", ".join(repr(x) for x in vals) + "}"
    raw = base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()
    return head + '{"' + raw + '"}'


def format_ref(g: GraphCore, v: Value) -> str:
    """`%name` / `%"odd.name"` / `%id`, plus `.k` for output k > 0."""
    node = g.nodes[v.node] if 0 <= v.node < len(g.nodes) else None
    name = node.name if node is not None and node.id == v.node else None
    if name is None:
        base = f"%{v.node}"
    elif _is_bare(name):
        base = f"%{name}"
    else:
        base = "%" + json.dumps(name)
    return base if v.index == 0 else f"{base}.{v.index}"


def _type_of(g: GraphCore, nid: int) -> str:
    if 0 <= nid < len(g.nodes) and g.nodes[nid].outputs:
        return str(g.nodes[nid].outputs[0])
    return "?"


def _format_types(outs: tuple[Shape, ...]) -> str:
    if len(outs) == 1:
        return str(outs[0])
    return "(" + ", ".join(str(s) for s in outs) + ")"


def _is_bare(s: str) -> bool:
    """Whether `s` prints unquoted: an ASCII identifier (what the parser's tokenizer reads; a
    non-ASCII `str.isidentifier()` name must be quoted) that is not a reserved word."""
    return s.isascii() and s.isidentifier() and s not in RESERVED_WORDS


def _ident_or_quoted(s: str) -> str:
    return s if _is_bare(s) else json.dumps(s)


def _comment(text: str, provenance: str | None) -> str:
    if provenance is None:
        return ""
    verbatim = (provenance == provenance.strip() and provenance.isprintable() and provenance
                and not provenance.startswith('"'))
    body = provenance if verbatim else json.dumps(provenance)
    last = text.rsplit("\n", 1)[-1]
    return " " * max(2, _COMMENT_COLUMN - len(last)) + "# " + body
