"""Reads text IR (the format `braze.ir.printer` writes) back into a Graph, exactly.

Nodes are rebuilt with `Graph.add_node`, so output types are re-inferred and must match the ones
written after `->`. Errors are ParseErrors giving the line, column, the offending line and a
hint."""
from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import BrazeError, ParseError
from .attrs import OpLiteral, decode_op, resolve_head
from .dtypes import ALL_DTYPES, dtype_from_name
from .op import Value
from .ops.io import Input, Param
from .shapes import Shape

if TYPE_CHECKING:
    from .graph import Graph

__all__ = ["parse_graph"]

# Strings are matched as runs between escapes: a group repeated per character keeps ~100 bytes
# of match state each (parsing a graph holding a 100 MB constant ran out of memory).
_TOKEN = re.compile(r"""
    (?P<nl>\n)
  | (?P<ws>[ \t\r]+)
  | (?P<comment>\#[^\n]*)
  | (?P<ref>%(?:[^\W\d]\w*|[0-9]+|"[^"\\\n]*(?:\\.[^"\\\n]*)*")(?:\.[0-9]+)?)
  | (?P<string>"[^"\\\n]*(?:\\.[^"\\\n]*)*")
  | (?P<number>-?(?:(?:inf|nan)(?![A-Za-z0-9_])
                   |[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?))
  | (?P<ident>[^\W\d]\w*)  # Unicode identifiers: symbolic dims may be any str.isidentifier()
  | (?P<punct>->|[()\[\]{},=:*+])
""", re.VERBOSE)
_DTYPE_NAMES = frozenset(d.name for d in ALL_DTYPES)


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    line: int
    col: int


@dataclass(frozen=True)
class _Ref:
    key: int | str  # the node id (int) for `%3`, else the node name (str): never confused
    index: int
    text: str


def parse_graph(text: str) -> Graph:
    """The graph that `str(graph)` printed as `text`. ParseError (line, column, hint) if bad."""
    if not isinstance(text, str):
        raise ParseError(f"text IR must be a str, got {type(text).__name__} (decode bytes "
                         "first: text.decode('utf-8'))")
    try:
        p = _Parser(text)
        p.skip_newlines()
        g = p.graph()
        p.skip_newlines()
        p.expect_kind("eof", "end of text after the graph's closing '}'")
    except RecursionError:
        raise ParseError("text IR nested too deeply to read (attribute values or graphs inside "
                         "graphs; corrupt or hostile text?)") from None
    return g


class _Parser:
    def __init__(self, text: str):
        self.lines = text.split("\n")
        self.toks = _tokenize(text)
        self.pos = 0

    # -- token helpers -------------------------------------------------------------------------
    @property
    def tok(self) -> _Tok:
        return self.toks[self.pos]

    def next(self) -> _Tok:
        t = self.toks[self.pos]
        self.pos += 1
        return t

    def at(self, text: str) -> bool:
        t = self.tok
        return t.text == text and t.kind in ("punct", "ident")

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.pos += 1
            return True
        return False

    def expect(self, text: str, hint: str = "") -> _Tok:
        if not self.at(text):
            self.fail(f"expected {text!r}, got {_show(self.tok)}", hint)
        return self.next()

    def expect_kind(self, kind: str, what: str, hint: str = "") -> _Tok:
        if self.tok.kind != kind:
            self.fail(f"expected {what}, got {_show(self.tok)}", hint)
        return self.next()

    def skip_newlines(self) -> None:
        while self.tok.kind in ("nl", "comment"):
            self.pos += 1

    def fail(self, msg: str, hint: str = "", tok: _Tok | None = None):
        t = tok or self.tok
        line = self.lines[t.line - 1] if 0 < t.line <= len(self.lines) else ""
        text = f"text IR line {t.line}, column {t.col}: {msg}\n    {line}\n    {' ' * (t.col - 1)}^"
        if hint:
            text += f"\n  hint: {hint}"
        raise ParseError(text)

    # -- graph -----------------------------------------------------------------------------------
    def graph(self) -> Graph:
        from .graph import Graph

        self.expect("graph", "text IR starts with `graph NAME(%input: f32[...]) params(...) {`")
        name = self.name_token("graph name")
        self.expect("(")
        inputs = self.decls()
        self.expect("params", "write `params()` even when the graph has none")
        self.expect("(")
        params = self.decls()
        self.expect("{")
        self.expect_kind("nl", "a new line after '{'")
        g = Graph(name, record_provenance=False)
        env: dict[str, int] = {}
        decl_kind = {r.key: "input" for r, _, _ in inputs} | {r.key: "param" for r, _, _ in params}
        decl_type = {r.key: (s, t) for r, s, t in inputs + params}
        while True:
            self.skip_newlines()
            if self.at("return"):
                ret_tok = self.next()
                outs = [] if self.tok.kind in ("nl", "comment") else self.refs(g, env)
                self.end_of_line()
                break
            if self.at("}"):
                self.fail("the graph body has no `return` line", "end the body with `return %v`")
            self.statement(g, env, decl_kind, decl_type)
        self.skip_newlines()
        self.expect("}", "nothing may follow `return` inside a graph body")
        g.input_ids = [self.declared_id(env, r, s, t, "input", g) for r, s, t in inputs]
        g.param_ids = [self.declared_id(env, r, s, t, "param", g) for r, s, t in params]
        try:
            g.set_outputs(outs)
        except BrazeError as e:
            self.fail(str(e), tok=ret_tok)
        g.record_provenance = True
        return g

    def name_token(self, what: str) -> str:
        t = self.tok
        if t.kind == "ident":
            return self.next().text
        if t.kind == "string":
            return _unquote(self, self.next())
        self.fail(f"expected {what}, got {_show(t)}")

    def decls(self) -> list[tuple[_Ref, _Tok, Shape]]:
        out = []
        while not self.at(")"):
            tok = self.tok
            ref = self.ref_token()
            self.expect(":", "declare each input and param as `%name: f32[dims]`")
            out.append((ref, tok, self.type_()))
            if not self.accept(","):
                break
        self.expect(")")
        return out

    def declared_id(self, env, ref: _Ref, tok: _Tok, shape: Shape, kind: str, g: Graph) -> int:
        if ref.key not in env:
            self.fail(f"{kind} {ref.text} is declared in the header but never defined",
                      f"add a line `{ref.text} = {kind}` where it belongs in node order", tok)
        nid = env[ref.key]
        if g.nodes[nid].outputs[:1] != (shape,):
            self.fail(f"{kind} {ref.text} is declared as {shape} but its node gives "
                      f"{', '.join(map(str, g.nodes[nid].outputs))}", tok=tok)
        return nid

    # -- statements ------------------------------------------------------------------------------
    def statement(self, g: Graph, env, decl_kind, decl_type) -> None:
        lhs_tok = self.tok
        lhs = self.ref_token()
        if lhs.index:
            self.fail(f"{lhs.text} names an output index; define a node as `%name = ...`",
                      tok=lhs_tok)
        if lhs.key in env:
            self.fail(f"{lhs.text} is defined twice", "every node needs its own name or id",
                      lhs_tok)
        self.expect("=", "a node line reads `%v = op[attrs](%a, %b) -> f32[dims]`")
        head_tok = self.tok
        if head_tok.kind == "ident" and head_tok.text in ("input", "param") and self.toks[
                self.pos + 1].kind in ("nl", "comment"):
            self.next()
            kind = head_tok.text
            if decl_kind.get(lhs.key) != kind:
                self.fail(f"{lhs.text} = {kind} but the header does not declare {lhs.text} "
                          f"as {'an input' if kind == 'input' else 'a param'}",
                          f"declare it in the graph's {kind}s: `{lhs.text}: f32[...]`", head_tok)
            if isinstance(lhs.key, int):
                self.fail(f"{kind} {lhs.text} needs a name", tok=lhs_tok)
            shape = decl_type[lhs.key][1]
            op = Input(lhs.key, shape) if kind == "input" else Param(lhs.key, shape)
            prov = self.end_of_line()
            self.add(g, env, lhs, op, (), prov, (shape,), head_tok)
            return
        op_lit = self.op_literal()
        self.expect("(", "list the node's inputs in parentheses, `()` when it has none")
        args = [] if self.at(")") else self.refs(g, env)
        self.expect(")")
        self.expect("->", "give the node's output type(s) after `->`")
        types = self.types()
        prov = self.end_of_line()
        try:
            kind, preset = resolve_head(op_lit.head)
            op = decode_op(kind, op_lit.attrs, preset=preset)
        except ParseError as e:
            self.fail(str(e), tok=head_tok)
        self.add(g, env, lhs, op, tuple(args), prov, types, head_tok)

    def add(self, g: Graph, env, lhs: _Ref, op, args, prov, types, tok: _Tok) -> None:
        name = None if isinstance(lhs.key, int) else lhs.key
        try:
            vals = g.add_node(op, args, name=name, provenance=prov)
        except BrazeError as e:
            self.fail(str(e), tok=tok)
        got = g.nodes[vals[0].node].outputs if vals else ()
        if tuple(got) != tuple(types):
            self.fail(f"{lhs.text} is written as {_types_str(types)} but {op.kind} infers "
                      f"{_types_str(got)}", "fix the type after `->` (or the inputs)", tok)
        env[lhs.key] = len(g.nodes) - 1

    def end_of_line(self) -> str | None:
        prov = None
        if self.tok.kind == "comment":
            prov = _provenance(self.next().text)
        if self.tok.kind != "eof":
            self.expect_kind("nl", "end of line", "one node per line; provenance goes in `# ...`")
        return prov

    # -- values and types ------------------------------------------------------------------------
    def int(self, text: str, tok: _Tok) -> int:
        """`text` (digits) as an int; a ParseError, not ValueError, when it is too long."""
        try:
            return int(text)
        except ValueError:
            self.fail(f"number {text[:20]}... has {len(text)} digits, too many", tok=tok)

    def ref_token(self) -> _Ref:
        t = self.expect_kind("ref", "a value such as %3 or %name")
        body, index = t.text[1:], 0
        m = re.fullmatch(r'(.*?)(?:\.([0-9]+))?', body, re.S)
        if m.group(2) is not None and not body.endswith('"'):
            body, index = m.group(1), self.int(m.group(2), t)
        if body.startswith('"'):
            key = _unquote(self, _Tok("string", body, t.line, t.col + 1))
        elif body.isdigit():
            key = self.int(body, t)
        else:
            key = body
        return _Ref(key, index, t.text)

    def refs(self, g: Graph, env) -> list[Value]:
        out = []
        while True:
            tok = self.tok
            r = self.ref_token()
            if r.key not in env:
                self.fail(f"{r.text} is not defined before this line",
                          "nodes must appear in topological order (inputs before users)", tok)
            nid = env[r.key]
            if r.index >= len(g.nodes[nid].outputs):
                self.fail(f"{r.text}: node has {len(g.nodes[nid].outputs)} output(s)", tok=tok)
            out.append(Value(nid, r.index))
            if not self.accept(","):
                return out

    def type_(self) -> Shape:
        t = self.tok
        if t.kind != "ident" or t.text not in _DTYPE_NAMES:
            self.fail(f"expected a type such as f32[2, seq], got {_show(t)}")
        self.next()
        self.expect("[")
        dims: list[int | str] = []
        while not self.at("]"):
            d = self.tok
            if (d.kind == "number" and d.text.isdigit()) or d.kind == "ident":
                dims.append(self.dim_expression())
            else:
                self.fail(f"expected a dim (an int or a symbol), got {_show(d)}")
            if not self.accept(","):
                break
        self.expect("]")
        return Shape(tuple(dims), dtype_from_name(t.text))

    def dim_expression(self) -> int | str:
        """An int, a symbol, or a polynomial over symbols (`batch*seq`, `past+seq`, `seq-1`)."""
        start = self.tok
        parts = [self.next().text]
        while True:
            if self.at("*") or self.at("+"):
                parts.append(self.next().text)
                if self.tok.kind not in ("ident", "number"):
                    self.fail(f"expected a symbol or an int after {parts[-1]!r}")
                parts.append(self.next().text)
            elif self.tok.kind == "number" and self.tok.text.startswith("-"):
                parts.append(self.next().text)
            else:
                break
        text = "".join(parts)
        if text.isdigit():
            return self.int(text, start)
        try:
            from .symbolic import canonical_dim

            canonical_dim(text)
        except ValueError as e:
            self.fail(f"bad symbolic dim {text!r}: {e}", tok=start)
        return text

    def types(self) -> tuple[Shape, ...]:
        if not self.accept("("):
            return (self.type_(),)
        out = []
        while not self.at(")"):
            out.append(self.type_())
            if not self.accept(","):
                break
        self.expect(")")
        return tuple(out)

    def op_literal(self) -> OpLiteral:
        head = self.expect_kind("ident", "an op name such as matmul or gelu").text
        attrs: dict[str, Any] = {}
        if self.accept("["):
            while not self.at("]"):
                key = self.expect_kind("ident", "an attribute name")
                if key.text in attrs:
                    self.fail(f"attribute {key.text!r} is given twice", tok=key)
                self.expect("=", "attributes read `name=value`")
                attrs[key.text] = self.value()
                if not self.accept(","):
                    break
            self.expect("]")
        return OpLiteral(head, attrs)

    def value(self) -> Any:
        t = self.tok
        if t.kind == "number":
            self.next()
            try:
                return _number(t.text)
            except ValueError:  # more digits than Python converts
                self.fail(f"number {t.text[:20]}... has {len(t.text)} digits, too many", tok=t)
        if t.kind == "string":
            return _unquote(self, self.next())
        if t.kind == "punct" and t.text == "(":
            self.next()
            items = []
            while not self.at(")"):
                items.append(self.value())
                if not self.accept(","):
                    break
            self.expect(")")
            return tuple(items)
        if t.kind == "ident":
            if t.text in ("true", "false"):
                self.next()
                return t.text == "true"
            if t.text == "none":
                self.next()
                return None
            if t.text == "graph":
                return self.graph()
            nxt = self.toks[self.pos + 1]
            if nxt.text == "[" and t.text in _DTYPE_NAMES:
                shape = self.type_()
                return self.array(shape) if self.at("{") else shape
            if nxt.text == "[":
                return self.op_literal()
            self.next()
            return t.text
        self.fail(f"expected an attribute value, got {_show(t)}")

    def array(self, shape: Shape) -> np.ndarray:
        start = self.expect("{")
        if not shape.is_static:
            self.fail(f"a constant needs static dims, got {shape}", tok=start)
        dt = shape.dtype.np
        if self.tok.kind == "string":
            raw_tok = self.next()
            try:
                raw = base64.b64decode(_unquote(self, raw_tok), validate=True)
                arr = np.frombuffer(raw, dtype=dt).reshape(shape.dims).copy()
            except ValueError as e:
                self.fail(f"bad base64 data for {shape}: {e}", tok=raw_tok)
        else:
            items = []
            while not self.at("}"):
                v = self.value()
                if not isinstance(v, (bool, int, float)):
                    self.fail(f"constant elements must be numbers or true/false, got {v!r}")
                items.append(v)
                if not self.accept(","):
                    break
            n = shape.numel()
            if len(items) != n:
                self.fail(f"{shape} needs {n} elements, got {len(items)}", tok=start)
            try:
                arr = np.array(items, dtype=dt).reshape(shape.dims)
            except (ValueError, OverflowError, TypeError) as e:
                self.fail(f"elements do not fit {shape}: {e}", tok=start)
        self.expect("}")
        return arr


def _tokenize(text: str) -> list[_Tok]:
    toks, pos, line, line_start = [], 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        col = pos - line_start + 1
        if m is None:
            src = text.split("\n")[line - 1]
            raise ParseError(f"text IR line {line}, column {col}: unexpected character "
                             f"{text[pos]!r}\n    {src}\n    {' ' * (col - 1)}^")
        kind = m.lastgroup
        if kind == "nl":
            toks.append(_Tok("nl", "\n", line, col))
            line, line_start = line + 1, m.end()
        elif kind != "ws":
            toks.append(_Tok(kind, m.group(), line, col))
        pos = m.end()
    toks.append(_Tok("eof", "", line, pos - line_start + 1))
    return toks


def _number(text: str) -> int | float:
    if any(c in text for c in ".eEn"):  # n: inf / nan
        return float(text)
    return int(text)


def _unquote(p: _Parser, tok: _Tok) -> str:
    try:
        return json.loads(tok.text)
    except ValueError:
        p.fail(f"bad string literal {tok.text}", tok=tok)


def _provenance(comment: str) -> str:
    body = comment[1:].removesuffix("\r")
    if body.startswith(" "):
        body = body[1:]
    if body.startswith('"'):
        try:
            v = json.loads(body)
            if isinstance(v, str):
                return v
        except ValueError:
            pass
    return body


def _show(t: _Tok) -> str:
    return {"nl": "end of line", "eof": "end of text"}.get(t.kind, repr(t.text))


def _types_str(types) -> str:
    return ", ".join(str(s) for s in types) if len(types) != 1 else str(types[0])
