"""C code generated from an ElementwiseRegion's body: one pass over memory, split across
threads by element range (not by row, so a 1-D tensor uses every thread), the innermost loop
vectorized with `omp simd`. float32 exp / tanh / erf / sigmoid / SiLU / GELU are the inline
approximations of codegen.vecmath (no libm calls); the kernels are built without -ffast-math,
so NaN and inf behave as in NumPy.

Inputs broadcast onto the output shape with stride 0; the shapes are concrete (a program is
planned per binding), so every stride is a literal the compiler folds, and adjacent dims that
every input walks contiguously are merged first (a [B, S, H] + [H] bias add is one row loop
of H, a same-shape region one flat loop). With `stream`, each thread computes a tile into a
stack buffer and writes it with non-temporal stores: large outputs then skip the read the
cache would do before the write. The source text keys the on-disk cache (codegen.cc); scalar
constants are not in it but read from an argument (codegen.scalars, but those that let the
compiler drop work), so the key is the region's structure: regions that differ only by a scale
or a bound share one compiled kernel.

float16 / bfloat16 values are stored as 16 bits, loaded as float32, and every body op whose
result is half-precision is rounded back to its type (float32 -> half -> float32) as the
reference rounds each NumPy op; logical activations follow the reference's formula step by
step (the dtypes it computes each step in); codegen/half.py has the details and the tolerance.
Regions that hold half values are built without FMA contraction and with trapping math
(`region_flags`), so that products and casts round as the reference's do."""
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
    StopGradient,
    Unary,
    UnaryFn,
    Where,
)
from ...ir.ops.io import Constant
from .cc import PARALLEL_MIN_ELEMENTS, PRECISE_FLAGS
from .half import HALF_TYPES, half_expr, half_load, half_prelude, half_store
from .scalars import ScalarArgs, scalar_args
from .vecmath import CALLS, VECMATH_C, libmvec_decls

__all__ = ["region_source", "region_constants", "region_scalars", "region_geometry",
           "region_flags", "Unsupported", "C_TYPES", "STREAM_TILE"]

C_TYPES = {"f32": "float", "f64": "double", "i32": "int32_t", "i64": "int64_t", "bool": "uint8_t",
           "i8": "int8_t", "u8": "uint8_t", "i16": "int16_t", "u32": "uint32_t"}
STREAM_TILE = 2048
"""Elements a thread computes into its stack buffer before streaming them out (8 KiB of
float32: stays in L1 with the inputs' lines)."""
_CHUNK = 1 << 16
"""Elements per unit of parallel work (256 KiB of float32 per stream), handed to threads
dynamically: on a busy machine a thread that waits for a core takes fewer chunks instead of
holding up the end of the region with a fixed half (a multiple of 16: chunks start 64-byte
aligned)."""

_STREAM_C = r"""
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
/* Copy n bytes from an L1-resident tile to dst, with non-temporal stores where aligned. */
static inline void bz_stream(void* dst, const void* src, int64_t n) {
  char* d = (char*)dst;
  const char* s = (const char*)src;
#if defined(__AVX__)
  int64_t head = (int64_t)((32 - ((uintptr_t)d & 31)) & 31);
  head = head < n ? head : n;
  memcpy(d, s, (size_t)head);
  d += head; s += head; n -= head;
  for (; n >= 32; n -= 32, d += 32, s += 32)
    _mm256_stream_si256((__m256i*)d, _mm256_loadu_si256((const __m256i*)s));
#elif defined(__SSE2__)
  int64_t head = (int64_t)((16 - ((uintptr_t)d & 15)) & 15);
  head = head < n ? head : n;
  memcpy(d, s, (size_t)head);
  d += head; s += head; n -= head;
  for (; n >= 16; n -= 16, d += 16, s += 16)
    _mm_stream_si128((__m128i*)d, _mm_loadu_si128((const __m128i*)s));
#endif
  memcpy(d, s, (size_t)n);
}
static inline void bz_stream_fence(void) {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}
"""


class Unsupported(Exception):
    """The region uses something the generator does not write (its kernel then declines)."""


def _f(dt: str, name: str) -> str:
    """The C math function for a float type (expf for float, exp for double)."""
    return name + ("f" if dt == "float" else "")


def _unary(fn: UnaryFn, a: str, t: str) -> str:
    if t == "float" and fn.value in CALLS:
        return f"{CALLS[fn.value]}({a})"
    f = lambda n: _f(t, n)  # noqa: E731
    half, one = f"({t})0.5", f"({t})1"
    table = {
        UnaryFn.GELU: f"{half} * {a} * ({one} + {f('erf')}({a} * ({t})0.70710678118654752))",
        UnaryFn.GELU_APPROX: f"{half} * {a} * ({one} + {f('tanh')}(({t})0.79788456080286536 * "
                             f"({a} + ({t})0.044715 * {a} * {a} * {a})))",
        UnaryFn.SILU: f"{a} / ({one} + {f('exp')}(-{a}))",
        UnaryFn.QUICK_GELU: f"{a} / ({one} + {f('exp')}(({t})-1.702 * {a}))",
        UnaryFn.HARD_SWISH: f"({a} * ({a} + 3 < 0 ? 0 : ({a} + 3 > 6 ? 6 : {a} + 3)) / ({t})6)",
        UnaryFn.RELU: f"({a} > 0 || {a} != {a} ? {a} : 0)",  # NaN stays (precise flags)
        UnaryFn.RELU6: f"({a} < 0 ? ({t})0 : ({a} > 6 ? ({t})6 : {a}))",
        UnaryFn.SIGMOID: f"{one} / ({one} + {f('exp')}(-{a}))",
        UnaryFn.TANH: f"{f('tanh')}({a})", UnaryFn.EXP: f"{f('exp')}({a})",
        UnaryFn.LOG: f"{f('log')}({a})", UnaryFn.SQRT: f"{f('sqrt')}({a})",
        UnaryFn.RSQRT: f"{one} / {f('sqrt')}({a})", UnaryFn.NEG: f"(-{a})",
        UnaryFn.SIN: f"{f('sin')}({a})",
        UnaryFn.COS: f"{f('cos')}({a})", UnaryFn.ERF: f"{f('erf')}({a})",
        UnaryFn.SQUARE: f"({a} * {a})", UnaryFn.RECIPROCAL: f"({one} / {a})",
        UnaryFn.FLOOR: f"{f('floor')}({a})", UnaryFn.CEIL: f"{f('ceil')}({a})",
        UnaryFn.NOT: f"(!{a})", UnaryFn.ROUND: f"{f('nearbyint')}({a})",
        **{fn: f"{f(fn.value)}({a})" for fn in (UnaryFn.TAN, UnaryFn.ASIN, UnaryFn.ACOS,
                                                UnaryFn.ATAN, UnaryFn.SINH, UnaryFn.COSH,
                                                UnaryFn.ASINH, UnaryFn.ACOSH, UnaryFn.ATANH)},
    }
    if t in ("float", "double"):  # keep -0.0 and NaN as NumPy does
        table[UnaryFn.ABS] = f"{f('fabs')}({a})"
        table[UnaryFn.SIGN] = f"({a} > 0 ? ({t})1 : ({a} < 0 ? ({t})-1 : {a}))"
    else:
        table[UnaryFn.ABS] = f"({a} < 0 ? -{a} : {a})"
        table[UnaryFn.SIGN] = f"(({a} > 0) - ({a} < 0))"
    if fn not in table:
        raise Unsupported(fn.value)
    return table[fn]


def _integer_division(fn: BinaryFn, a: str, b: str, t: str) -> str | None:
    """DIV (floor), MOD (the divisor's sign) and FMOD (the dividend's) on integers as NumPy
    computes them: a zero divisor gives 0, and x / -1 wraps (no C overflow)."""
    if not t.startswith(("int", "uint")) or fn not in (BinaryFn.DIV, BinaryFn.MOD,
                                                      BinaryFn.FMOD):
        return None
    if t.startswith("uint"):
        return f"({b} == 0 ? ({t})0 : ({t})({a} {'/' if fn is BinaryFn.DIV else '%'} {b}))"
    u = "u" + t
    if fn is BinaryFn.DIV:
        q = (f"({a} / {b} - (({a} % {b} != 0) && (({a} < 0) != ({b} < 0))))")
        return f"({b} == 0 ? ({t})0 : ({b} == -1 ? ({t})(({u})0 - ({u}){a}) : ({t}){q}))"
    r = f"({a} % {b})"
    if fn is BinaryFn.MOD:
        r = f"({r} + (({r} != 0 && (({r} < 0) != ({b} < 0))) ? {b} : 0))"
    return f"(({b} == 0 || {b} == -1) ? ({t})0 : ({t}){r})"


def _binary(fn: BinaryFn, a: str, b: str, t: str) -> str:
    integer = _integer_division(fn, a, b, t)
    if integer is not None:
        return integer
    if fn is BinaryFn.FMOD and t in ("float", "double"):
        return f"{_f(t, 'fmod')}({a}, {b})"
    if fn is BinaryFn.MOD and t in ("float", "double"):  # NumPy: the divisor's sign, -0 kept
        m = f"{_f(t, 'fmod')}({a}, {b})"
        return (f"({b} == 0 ? {m} : ({m} != 0 ? ((({m} < 0) != ({b} < 0)) ? {m} + {b} : {m})"
                f" : {_f(t, 'copysign')}(({t})0, {b})))")
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


_INT_RANGE = {"int8_t": 8, "int16_t": 16, "int32_t": 32, "uint8_t": -8, "uint16_t": -16,
              "uint32_t": -32}


def _int_clamp(op_: Clamp, x: str, t: str) -> str:
    """An integer clamp as the reference computes it (np.clip against float bounds: compared
    in float64, the chosen bound truncated back): exact for types of up to 32 bits, whose
    values float64 holds; a bound outside the type never applies. 64-bit types (float64
    rounds their values) and a bound that would be stored outside the type are Unsupported."""
    bits = _INT_RANGE.get(t)
    if bits is None:
        raise Unsupported(f"clamp on {t}")
    low, high = (0, 2 ** -bits - 1) if bits < 0 else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)
    lo, hi = float(op_.lo), float(op_.hi)
    if lo > high or hi < low:
        raise Unsupported("clamp to a bound outside the integer type")
    out = x
    if hi < high:
        out = f"((double){x} > {hi!r} ? ({t}){math.trunc(hi)} : {out})"
    if lo > low:
        out = f"((double){x} < {lo!r} ? ({t}){math.trunc(lo)} : {out})"
    return f"({out})"


def _int32_or_min(x: str) -> str:
    """int32(x) truncated, INT32_MIN where x is NaN or outside [-2^31, 2^31) (no UB)."""
    return (f"((double)({x}) >= -2147483648.0 && (double)({x}) < 2147483648.0 "
            f"? (int32_t)({x}) : INT32_MIN)")


def _float_to_int(x: str, t: str) -> str:
    """C for the float -> integer conversion braze defines (ir/ops/float_to_int.py), with
    explicit compares: an out-of-range C cast is undefined (and folded differently for a
    literal than computed for an argument)."""
    if t in ("int64_t", "uint32_t"):
        return (f"(({t})((double)({x}) >= -9223372036854775808.0 && (double)({x}) < "
                f"9223372036854775808.0 ? (int64_t)({x}) : INT64_MIN))")
    if t in ("int8_t", "int16_t", "int32_t", "uint8_t"):
        return f"(({t}){_int32_or_min(x)})"
    raise Unsupported(f"cast to {t}")


def _expr(op_, a: list[str], t: str, it: str, scalar=None) -> str:
    """C expression of one body node of type `t` over argument expressions `a` (the first
    of type `it`); `scalar(attribute)` names a clamp bound or leaky slope read from the
    kernel's arguments, None where it is a literal (codegen.scalars)."""
    named = scalar or (lambda attr: None)
    if isinstance(op_, Unary):
        return _unary(op_.fn, a[0], t)
    if isinstance(op_, Binary):
        return _binary(op_.fn, a[0], a[1], t)
    if isinstance(op_, Compare):
        return f"({a[0]} {_CMP[op_.fn]} {a[1]})"
    if isinstance(op_, Where):
        return f"({a[0]} ? {a[1]} : {a[2]})"
    if isinstance(op_, Cast):
        if op_.dtype.name == "bool":
            return f"({a[0]} != 0)"
        if it in ("float", "double") and t not in ("float", "double"):
            return _float_to_int(a[0], t)
        return f"(({t})({a[0]}))"
    if isinstance(op_, Clamp):
        if t not in ("float", "double"):
            return _int_clamp(op_, a[0], t)
        lo, hi = named("lo") or _literal(op_.lo, t), named("hi") or _literal(op_.hi, t)
        return f"({a[0]} < {lo} ? {lo} : ({a[0]} > {hi} ? {hi} : {a[0]}))"
    if isinstance(op_, LeakyRelu):
        alpha = named("alpha") or _literal(op_.alpha, t)
        return f"({a[0]} >= 0 ? {a[0]} : {a[0]} * {alpha})"
    if isinstance(op_, IsNan):
        return f"({a[0]} != {a[0]})"
    if isinstance(op_, StopGradient):
        return a[0]
    if isinstance(op_, IsInf):
        pos = f"({a[0]} == ({it})INFINITY)" if op_.detect_positive else "0"
        neg = f"({a[0]} == -({it})INFINITY)" if op_.detect_negative else "0"
        return f"({pos} || {neg})"
    raise Unsupported(op_.kind)


def broadcast_strides(in_dims: tuple[int, ...], out_dims: tuple[int, ...]) -> list[int]:
    """Element strides of a contiguous input of `in_dims` broadcast onto `out_dims`."""
    sd = (1,) * (len(out_dims) - len(in_dims)) + in_dims
    strides, acc = [], 1
    for d in reversed(sd):
        strides.append(acc if d != 1 else 0)
        acc *= d
    return list(reversed(strides))


def coalesce(dims: tuple[int, ...], strides: list[list[int]]
             ) -> tuple[tuple[int, ...], list[list[int]]]:
    """Merge adjacent dims that the output and every input walk as one (stride[i] ==
    stride[i+1] * dims[i+1]), and drop dims of size 1: the loop nest has fewer, longer rows."""
    out_d: list[int] = []
    out_s: list[list[int]] = [[] for _ in strides]
    for i, d in enumerate(dims):
        if d == 1:
            continue
        if out_d and all(s[-1] == st[i] * d for s, st in zip(out_s, strides)):
            out_d[-1] *= d
            for s, st in zip(out_s, strides):
                s[-1] = st[i]
            continue
        out_d.append(d)
        for s, st in zip(out_s, strides):
            s.append(st[i])
    return tuple(out_d), out_s


def _tables(body) -> list:
    """The body's constant nodes of more than one value (a mask or table folded into the
    region), in body order."""
    return [n for n in body.nodes if isinstance(n.op, Constant) and n.op.value.size != 1]


def region_constants(op) -> list[np.ndarray]:
    """The arrays of the body's tables (`_tables`), which the generated function reads after
    the outputs."""
    return [np.ascontiguousarray(n.op.value) for n in _tables(op.body)]


def region_scalars(op) -> np.ndarray | None:
    """The array of the body's scalar arguments (codegen.scalars), which the generated
    function reads after the tables; None when every scalar is a literal."""
    scalars = scalar_args(op.body, _value_type)
    return scalars.packed() if scalars.values else None


def _layout(op, in_shapes, out_shape):
    """(sources, dims, strides): each array the body reads (node id, type, C name, args
    position: the inputs, then the tables after the outputs) and the coalesced loop dims with
    every source's element strides along them."""
    body = op.body
    full = tuple(int(d) for d in out_shape.dims)
    tables = _tables(body)
    sources = [(nid, s, f"in{i}", i) for i, (nid, s) in enumerate(zip(body.input_ids, in_shapes))]
    first_table = len(in_shapes) + len(body.outputs)
    sources += [(n.id, n.outputs[0], f"k{i}", first_table + i) for i, n in enumerate(tables)]
    raw = [broadcast_strides(tuple(int(d) for d in s.dims), full) for _, s, _, _ in sources]
    dims, strides = coalesce(full, raw)
    return sources, dims, strides


def region_geometry(op, in_shapes, out_shape) -> np.ndarray:
    """The int64 sizes a region built with `sizes=True` reads from its last argument: the
    element count, the row length, (rows per step, length) of each outer dim, then each
    source's stride along each outer dim."""
    _, dims, strides = _layout(op, in_shapes, out_shape)
    lead = dims[:-1]
    total = int(np.prod(dims, dtype=np.int64)) if dims else 1
    geo = [total, dims[-1] if dims else 1]
    for i, d in enumerate(lead):
        geo += [int(np.prod(lead[i + 1:], dtype=np.int64)), d]
    for st in strides:
        geo += st[:len(lead)]
    return np.asarray(geo, np.int64)


def region_source(op, in_shapes, out_shape, fn_name: str, stream: bool = False,
                  sizes: bool = False) -> str:
    """C source of `void fn_name(void** args)` computing the region (inputs, then outputs,
    then region_constants(op), then region_scalars(op) if any, in args) for concrete input
    shapes broadcast to `out_shape` (all outputs share it). Scalar constants are read from
    their argument, not written into the source (but those codegen.scalars keeps literal), so
    regions that differ only by them have one source. With `sizes`, the lengths and strides
    are not literals but read from one more argument (region_geometry's array): the same
    source, compiled once, then serves every shape with the same broadcast pattern (a
    dynamic-size model's region at each new binding)."""
    body = op.body
    sources, dims, strides = _layout(op, in_shapes, out_shape)
    full_total = int(np.prod(dims, dtype=np.int64)) if dims else 1
    cols = dims[-1] if dims else 1
    lead = dims[:-1]
    scalars = scalar_args(body, _value_type)
    scalars_at = len(in_shapes) + len(body.outputs) + len(_tables(body))
    if sizes:
        geo_at = scalars_at + (1 if scalars.values else 0)
        total_c, cols_c = "total", "cols"
        decls = [f"  const int64_t* G = (const int64_t*)args[{geo_at}];",
                 "  const int64_t total = G[0], cols = G[1];"]
    else:
        total_c, cols_c = f"{full_total}LL", str(cols)
        decls = []
    env, row_offsets = {}, []
    for k, ((nid, s, name, at), st) in enumerate(zip(sources, strides)):
        stored, t = _storage_type(s.dtype.name), _value_type(s.dtype.name)
        decls.append(f"  const {stored}* {name} = (const {stored}*)args[{at}];")
        if not lead:
            off = "0"
        elif sizes:
            off = _runtime_row_offset(st[:-1], 2 + 2 * len(lead) + k * len(lead))
        else:
            off = _row_offset(lead, st[:-1])
        inner = "c" if st and st[-1] else "0"
        if off != "0":
            row_offsets.append(f"      const int64_t o{name} = {off};")
            inner = f"o{name} + {inner}" if inner != "0" else f"o{name}"
        ref = f"{name}[{inner}]"
        env[(nid, 0)] = (half_load(s.dtype.name, ref) if s.dtype.name in HALF_TYPES else ref, t)
    lines = _body_lines(body, env, scalars)
    outs, tiles, stores = [], [], []
    for j, v in enumerate(body.outputs):
        expr, _ = env[(v.node, v.index)]
        dt = body.shape_of(v).dtype.name
        t = _storage_type(dt)
        if dt in HALF_TYPES:
            expr = half_store(dt, expr)
        decls.append(f"  {t}* out{j} = ({t}*)args[{len(in_shapes) + j}];")
        if stream:
            tiles.append(f"    {t} tile{j}[{STREAM_TILE}] __attribute__((aligned(64)));")
            outs.append(f"        tile{j}[c - c0] = {expr};")
            stores.append(f"      bz_stream(out{j} + i, tile{j}, n * (int64_t)sizeof({t}));")
        else:
            outs.append(f"        out{j}[i - c0 + c] = {expr};")
    chunk = f"{_CHUNK}LL"
    if sizes:
        split = [
            f"  #pragma omp parallel for schedule(dynamic, 1) if (total > "
            f"{PARALLEL_MIN_ELEMENTS}LL)",
            f"  for (int64_t chunk = 0; chunk < (total + {chunk} - 1) / {chunk}; chunk++) {{",
            f"    const int64_t lo = chunk * {chunk};",
            f"    const int64_t hi = lo + {chunk} < total ? lo + {chunk} : total;",
        ]
    elif full_total > PARALLEL_MIN_ELEMENTS:
        split = [
            "  #pragma omp parallel for schedule(dynamic, 1)",
            f"  for (int64_t chunk = 0; chunk < {-(-full_total // _CHUNK)}; chunk++) {{",
            f"    const int64_t lo = chunk * {chunk};",
            f"    const int64_t hi = lo + {chunk} < {total_c} ? lo + {chunk} : {total_c};",
        ]
    else:
        split = ["  {", f"    const int64_t lo = 0, hi = {total_c};"]
    row = [f"      const int64_t r = i / {cols_c}, c0 = i - r * {cols_c};"] \
        if lead else ["      const int64_t c0 = i;"]
    limit = f"      if (n > {STREAM_TILE}) n = {STREAM_TILE};" if stream else ""
    return "\n".join([
        "#include <math.h>", "#include <stdint.h>", "#include <string.h>", libmvec_decls(),
        VECMATH_C + (half_prelude() if _holds_half(body) else ""), _STREAM_C if stream else "",
        f"void {fn_name}(void** args) {{",
        *decls,
        *split, *scalars.decls(scalars_at), *tiles,
        "    for (int64_t i = lo; i < hi;) {",
        *row,
        f"      int64_t n = {cols_c} - c0 < hi - i ? {cols_c} - c0 : hi - i;",
        limit,
        *row_offsets,
        "      #pragma omp simd",
        "      for (int64_t c = c0; c < c0 + n; c++) {",
        *lines, *outs,
        "      }",
        *stores,
        "      i += n;",
        "    }",
        "    bz_stream_fence();" if stream else "",
        "  }", "}", ""])


def _runtime_row_offset(strides: list[int], first: int) -> str:
    """Element offset of output row r for one source, from region_geometry's array G: outer
    dim i is ((r / G[2 + 2i]) % G[3 + 2i]) * G[first + i]; only the dims the source walks
    (a nonzero stride here) appear."""
    terms = [f"((r / G[{2 + 2 * i}]) % G[{3 + 2 * i}]) * G[{first + i}]"
             for i, st in enumerate(strides) if st]
    return " + ".join(terms) if terms else "0"


def _body_lines(body, env: dict, scalars: ScalarArgs) -> list[str]:
    """`const T vK = expr;` per body node, in order; fills `env` with each value's name (a
    scalar constant's is its literal or its argument's name)."""
    lines = []
    for node in body.nodes:
        op_ = node.op
        if (op_.source and not isinstance(op_, Constant)) or (node.id, 0) in env:
            continue  # an input, or a table read from its array
        dt = node.outputs[0].dtype.name
        t = _value_type(dt)
        if isinstance(op_, Constant):  # a scalar: tables are read from their arrays
            value = scalars.name(node.id, "value") or _literal(op_.value.reshape(-1)[0], t)
            env[(node.id, 0)] = (value, t)
            continue
        a = [env[(v.node, v.index)][0] for v in node.inputs]
        it = env[(node.inputs[0].node, node.inputs[0].index)][1] if node.inputs else t
        name = f"v{len(lines)}"
        scalar = lambda attr, nid=node.id: scalars.name(nid, attr)  # noqa: E731
        expr = (half_expr(op_, a, dt, it, _expr, scalar) if dt in HALF_TYPES
                else _expr(op_, a, t, it, scalar))
        lines.append(f"        const {t} {name} = {expr};")
        env[(node.id, 0)] = (name, t)
    return lines


def _value_type(dtype: str) -> str:
    """The C type a value of `dtype` is computed in (float32 for the half types)."""
    t = "float" if dtype in HALF_TYPES else C_TYPES.get(dtype)
    if t is None:
        raise Unsupported(dtype)
    return t


def _storage_type(dtype: str) -> str:
    """The C type a value of `dtype` is stored in."""
    return "uint16_t" if dtype in HALF_TYPES else _value_type(dtype)


def _holds_half(body) -> bool:
    return any(o.dtype.name in HALF_TYPES for n in body.nodes for o in n.outputs)


def region_flags(op) -> tuple[str, ...]:
    """Compiler flags for the region's source: cc.PRECISE_FLAGS, except where the body holds
    float16 / bfloat16 values, whose results must be the reference's bits: no FMA contraction
    (the reference rounds every product) and trapping math kept (without it GCC folds
    (float)(int)x into trunc(x): -0 and inf where NumPy's casts give +0 and INT_MIN). Both
    leave the loops vectorized."""
    if not _holds_half(op.body):
        return PRECISE_FLAGS
    return tuple("-ffp-contract=off" if f.startswith("-ffp-contract") else f
                 for f in PRECISE_FLAGS if f != "-fno-trapping-math")


def _row_offset(lead: tuple[int, ...], strides: list[int]) -> str:
    """Element offset of output row r for one input: sum of (index of r on dim i) * stride."""
    terms, div = [], 1
    for d, st in zip(reversed(lead), reversed(strides)):
        if st:
            idx = f"(r / {div})" if div != 1 else "r"
            terms.append(f"({idx} % {d}) * {st}" if div * d < _rows(lead) else f"{idx} * {st}")
        div *= d
    return " + ".join(terms) if terms else "0"


def _rows(lead: tuple[int, ...]) -> int:
    return int(np.prod(lead, dtype=np.int64)) if lead else 1
