"""Building blocks of the C kernels that must give the reference's bits (selection, indexing,
integer and half-precision element-wise ops, RoPE of any layout): compile flags that keep IEEE
semantics and never contract `a * b - c * d` into an FMA (NumPy rounds each product), the
float16 / bfloat16 conversions, and per-dtype C type tables. `build(source, name, signatures)`
is codegen.cc's cached compile with those flags (None without a compiler: the ops then run
their reference)."""
from __future__ import annotations

import ctypes

from ..codegen import cc

__all__ = ["FLAGS", "HALF_C", "PRELUDE", "C_TYPE", "build", "P", "I64", "INT", "F64"]

FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
         "-fopenmp", "-fPIC", "-std=gnu11")

HALF_C = r"""
/* float16 through GCC's _Float16 (F16C conversions, round to nearest even, NaN kept quiet);
   bfloat16 as the top half of a float32 (round to nearest even, NaN quieted). */
static inline float f16_load(uint16_t h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static inline uint16_t f16_store(float x) {
  _Float16 f = (_Float16)x; uint16_t h; memcpy(&h, &f, 2); return h;
}
static inline float bf16_load(uint16_t h) {
  union { uint32_t u; float f; } c = {(uint32_t)h << 16};
  return c.f;
}
static inline uint16_t bf16_store(float x) {
  union { float f; uint32_t u; } c = {x};
  uint32_t u = c.u;
  uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
  return (uint16_t)(nan ? ((u >> 16) | 0x40u) : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
}
"""

PRELUDE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
""" + cc.parallel_min_define() + HALF_C

# braze dtype name -> the C type of its storage
C_TYPE = {"f32": "float", "f64": "double", "f16": "uint16_t", "bf16": "uint16_t",
          "i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t",
          "u8": "uint8_t", "u32": "uint32_t", "bool": "uint8_t"}

P, I64, INT, F64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double


def build(source: str, name: str, signatures: dict) -> ctypes.CDLL | None:
    """The library compiled from PRELUDE + `source` with FLAGS, or None (no compiler)."""
    return cc.load_library(PRELUDE + source, name, signatures, FLAGS)
