"""C code generated from an ElementwiseRegion's body: one pass over memory, OpenMP across
rows, the innermost loop vectorized (libmvec for expf / tanhf / erff under -ffast-math).
Inputs broadcast onto the output shape with stride 0; the shapes are concrete (a program is
planned per binding), so every stride is a literal the compiler folds. The source text keys the
on-disk cache (codegen.cc), so a region compiles once per machine."""
from __future__ import annotations

import math

import numpy as np

from ...ir.ops.elementwise import (
    Binary,
    BinaryFn,
    Cast,
    Clamp,
    Compare,
    CompareFn,
    IsInf,
    IsNan,
    LeakyRelu,
    Unary,
    UnaryFn,
    Where,
)
from ...ir.ops.io import Constant
from .cc import PARALLEL_MIN_ELEMENTS, simd_math_decls

__all__ = ["region_source", "Unsupported", "C_TYPES"]

C_TYPES = {"f32": "float", "f64": "double", "i32": "int32_t", "i64": "int64_t", "bool": "uint8_t",
           "i8": "int8_t", "u8": "uint8_t", "i16": "int16_t", "u32": "uint32_t"}


class Unsupported(Exception):
    """The region uses something the generator does not write (its kernel then declines)."""


def _f(dt: str, name: str) -> str:
    """The C math function for a float type (expf for float, exp for double)."""
    return name + ("f" if dt == "float" else "")


def _unary(fn: UnaryFn, a: str, t: str) -> str:
    f = lambda n: _f(t, n)  # noqa: E731
    half, one = f"({t})0.5", f"({t})1"
    table = {
        UnaryFn.GELU: f"{half} * {a} * ({one} + {f('erf')}({a} * ({t})0.70710678118654752))",
        UnaryFn.GELU_APPROX: f"{half} * {a} * ({one} + {f('tanh')}(({t})0.79788456080286536 * "
                             f"({a} + ({t})0.044715 * {a} * {a} * {a})))",
        UnaryFn.SILU: f"{a} / ({one} + {f('exp')}(-{a}))",
        UnaryFn.QUICK_GELU: f"{a} / ({one} + {f('exp')}(({t})-1.702 * {a}))",
        UnaryFn.RELU: f"({a} > 0 ? {a} : 0)",
        UnaryFn.SIGMOID: f"{one} / ({one} + {f('exp')}(-{a}))",
        UnaryFn.TANH: f"{f('tanh')}({a})", UnaryFn.EXP: f"{f('exp')}({a})",
        UnaryFn.LOG: f"{f('log')}({a})", UnaryFn.SQRT: f"{f('sqrt')}({a})",
        UnaryFn.RSQRT: f"{one} / {f('sqrt')}({a})", UnaryFn.NEG: f"(-{a})",
        UnaryFn.ABS: f"({a} < 0 ? -{a} : {a})", UnaryFn.SIN: f"{f('sin')}({a})",
        UnaryFn.COS: f"{f('cos')}({a})", UnaryFn.ERF: f"{f('erf')}({a})",
        UnaryFn.SQUARE: f"({a} * {a})", UnaryFn.RECIPROCAL: f"({one} / {a})",
        UnaryFn.FLOOR: f"{f('floor')}({a})", UnaryFn.CEIL: f"{f('ceil')}({a})",
        UnaryFn.SIGN: f"(({a} > 0) - ({a} < 0))", UnaryFn.NOT: f"(!{a})",
        UnaryFn.ROUND: f"{f('nearbyint')}({a})",
    }
    if fn not in table:
        raise Unsupported(fn.value)
    return table[fn]


def _binary(fn: BinaryFn, a: str, b: str, t: str) -> str:
    if fn is BinaryFn.DIV and t.startswith(("int", "uint")):
        raise Unsupported("integer division")
    ops = {BinaryFn.ADD: "+", BinaryFn.SUB: "-", BinaryFn.MUL: "*", BinaryFn.DIV: "/",
           BinaryFn.AND: "&&", BinaryFn.OR: "||"}
    if fn in ops:
        return f"({a} {ops[fn]} {b})"
    if fn is BinaryFn.XOR:
        return f"((!{a}) != (!{b}))"
    if fn is BinaryFn.MAX:  # NaN propagates, as NumPy's maximum
        return f"(({a} > {b} || {a} != {a}) ? {a} : {b})"
    if fn is BinaryFn.MIN:
        return f"(({a} < {b} || {a} != {a}) ? {a} : {b})"
    if fn is BinaryFn.POW and t in ("float", "double"):
        return f"{_f(t, 'pow')}({a}, {b})"
    raise Unsupported(fn.value)


_CMP = {CompareFn.EQ: "==", CompareFn.NE: "!=", CompareFn.LT: "<", CompareFn.LE: "<=",
        CompareFn.GT: ">", CompareFn.GE: ">="}


def _literal(v, t: str) -> str:
    v = v.item() if hasattr(v, "item") else v
    if isinstance(v, bool):
        return "1" if v else "0"
    if t in ("float", "double"):
        if math.isinf(v):
            return f"(({t})INFINITY)" if v > 0 else f"(-({t})INFINITY)"
        if math.isnan(v):
            return f"(({t})NAN)"
        return f"(({t}){float(v)!r})"
    return f"(({t}){int(v)})"


def region_source(op, in_shapes, out_shape, fn_name: str) -> str:
    """C source of `void fn_name(void** args)` computing the region (inputs, then outputs, in
    args) for concrete input shapes broadcast to `out_shape` (all outputs share it)."""
    body = op.body
    dims = tuple(int(d) for d in out_shape.dims)
    rank = len(dims)
    cols = dims[-1] if rank else 1
    rows = int(np.prod(dims[:-1], dtype=np.int64)) if rank > 1 else 1
    lines, env, decls = [], {}, []
    for i, (nid, s) in enumerate(zip(body.input_ids, in_shapes)):
        t = C_TYPES.get(s.dtype.name)
        if t is None:
            raise Unsupported(s.dtype.name)
        sd = (1,) * (rank - s.rank) + tuple(int(d) for d in s.dims)
        strides, acc = [], 1
        for d in reversed(sd):
            strides.append(acc if d != 1 else 0)
            acc *= d
        strides = list(reversed(strides))
        row_terms = _row_offset(dims[:-1], strides[:-1]) if rank > 1 else "0"
        inner = strides[-1] if rank else 0
        decls.append(f"  const {t}* in{i} = (const {t}*)args[{i}];")
        env[(nid, 0)] = (f"in{i}[{row_terms} + c * {inner}]", t)
    out_vals = []
    counter = 0
    for node in body.nodes:
        op_ = node.op
        if node.op.source and not isinstance(op_, Constant):
            continue
        t = C_TYPES.get(node.outputs[0].dtype.name)
        if t is None:
            raise Unsupported(node.outputs[0].dtype.name)
        if isinstance(op_, Constant):
            if op_.value.size != 1:
                raise Unsupported("a non-scalar constant")
            env[(node.id, 0)] = (_literal(op_.value.reshape(-1)[0], t), t)
            continue
        a = [env[(v.node, v.index)][0] for v in node.inputs]
        it = env[(node.inputs[0].node, node.inputs[0].index)][1] if node.inputs else t
        if isinstance(op_, Unary):
            expr = _unary(op_.fn, a[0], t)
        elif isinstance(op_, Binary):
            expr = _binary(op_.fn, a[0], a[1], t)
        elif isinstance(op_, Compare):
            expr = f"({a[0]} {_CMP[op_.fn]} {a[1]})"
        elif isinstance(op_, Where):
            expr = f"({a[0]} ? {a[1]} : {a[2]})"
        elif isinstance(op_, Cast):
            expr = f"(({t})({a[0]}))" if op_.dtype.name != "bool" else f"({a[0]} != 0)"
        elif isinstance(op_, Clamp):
            lo, hi = _literal(op_.lo, t), _literal(op_.hi, t)
            expr = f"({a[0]} < {lo} ? {lo} : ({a[0]} > {hi} ? {hi} : {a[0]}))"
        elif isinstance(op_, LeakyRelu):
            expr = f"({a[0]} >= 0 ? {a[0]} : {a[0]} * {_literal(op_.alpha, t)})"
        elif isinstance(op_, IsNan):
            expr = f"({a[0]} != {a[0]})"
        elif isinstance(op_, IsInf):
            pos = f"({a[0]} == ({it})INFINITY)" if op_.detect_positive else "0"
            neg = f"({a[0]} == -({it})INFINITY)" if op_.detect_negative else "0"
            expr = f"({pos} || {neg})"
        else:
            raise Unsupported(op_.kind)
        name = f"v{counter}"
        counter += 1
        lines.append(f"      const {t} {name} = {expr};")
        env[(node.id, 0)] = (name, t)
    for j, v in enumerate(body.outputs):
        expr, t = env[(v.node, v.index)]
        k = len(in_shapes) + j
        decls.append(f"  {t}* out{j} = ({t}*)args[{k}];")
        out_vals.append(f"      out{j}[r * {cols} + c] = {expr};")
    return "\n".join([
        "#include <math.h>", "#include <stdint.h>", simd_math_decls(),
        f"void {fn_name}(void** args) {{",
        *decls,
        "  #pragma omp parallel for schedule(static)"
        + ("" if rows * cols > PARALLEL_MIN_ELEMENTS else " if(0)"),
        f"  for (int64_t r = 0; r < {rows}; r++) {{",
        "    #pragma omp simd",
        f"    for (int64_t c = 0; c < {cols}; c++) {{",
        *lines, *out_vals,
        "    }", "  }", "}", ""])


def _row_offset(lead: tuple[int, ...], strides: list[int]) -> str:
    """Element offset of output row r for one input: sum of (index of r on dim i) * stride."""
    terms, div = [], 1
    for d, st in zip(reversed(lead), reversed(strides)):
        if st:
            terms.append(f"((r / {div}) % {d}) * {st}" if d != 1 else "0")
        div *= d
    return " + ".join(terms) if terms else "0"
