"""What a scalar constant costs as a kernel argument instead of a literal, in loops like the
generated element-wise regions' (`omp simd`, cc.PRECISE_FLAGS): one thread, CPU time
(process_time), literal and argument versions alternating over 15 rounds, medians in ns per
element, on 4096 floats (in L1: the arithmetic shows) and 4M floats (memory-bound).
codegen/scalars.py keeps literal what this shows to matter.

    python bench/region_scalar_cost.py
"""
import ctypes
import statistics
import time

import numpy as np

from braze.runtime.codegen import cc

CASES = {  # name: (expr with K0/K1 for the constants, literal values)
    "mul_add":   ("x * K0 + K1", ("0.5f", "3.0f")),
    "div3":      ("x / K0", ("3.0f",)),
    "div2":      ("x / K0", ("2.0f",)),
    "mul1":      ("x * K0", ("1.0f",)),
    "clamp_inf": ("(x < K0 ? K0 : (x > K1 ? K1 : x))", ("(-INFINITY)", "6.0f")),
    "clamp":     ("(x < K0 ? K0 : (x > K1 ? K1 : x))", ("0.5f", "6.0f")),
    "pow2":      ("powf(x, K0)", ("2.0f",)),
    "pow3":      ("powf(x, K0)", ("3.0f",)),
    "leaky":     ("(x >= 0 ? x : x * K0)", ("0.01f",)),
    "idiv7":     ("(float)((int32_t)x / K0)", ("7",)),
}
src = ["#include <math.h>", "#include <stdint.h>"]
for name, (expr, lits) in CASES.items():
    itype = "int32_t" if name.startswith("i") else "float"
    lit = expr
    arg = expr
    for i, v in enumerate(lits):
        lit = lit.replace(f"K{i}", v)
        arg = arg.replace(f"K{i}", f"k{i}")
    params = ", ".join(f"{itype} k{i}" for i in range(len(lits)))
    for mode, e in (("lit", lit), ("arg", arg)):
        src.append(f"""void {name}_{mode}(const float* restrict in, float* restrict out,
                 int64_t n, int reps{', ' + params}) {{
  for (int r = 0; r < reps; r++) {{
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) {{ const float x = in[i]; out[i] = {e}; }}
  }}
}}""")
lib = cc.compile_c("\n".join(src), "lit_vs_arg", cc.PRECISE_FLAGS)
rng = np.random.default_rng(0)
for n, reps in ((4096, 2000), (1 << 22, 2)):
    x = rng.standard_normal(n).astype(np.float32) * 10
    y = np.empty_like(x)
    for name, (_expr, lits) in CASES.items():
        itype = ctypes.c_int32 if name.startswith("i") else ctypes.c_float
        vals = [itype(int(v)) if itype is ctypes.c_int32 else
                itype(float(v.rstrip("f").replace("(-INFINITY)", "-inf"))) for v in lits]
        fl, fa = getattr(lib, name + "_lit"), getattr(lib, name + "_arg")
        args = (ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data),
                ctypes.c_int64(n), ctypes.c_int(reps))
        t = {"lit": [], "arg": []}
        for _ in range(15):
            for mode, f in (("lit", fl), ("arg", fa)):
                t0 = time.process_time()
                f(*args) if mode == "lit" else f(*args, *vals)
                t[mode].append(time.process_time() - t0)
        ml, ma = (statistics.median(t[m]) / (n * reps) * 1e9 for m in ("lit", "arg"))
        print(f"{name:10s} n={n:8d} literal {ml:.3f} ns/elem  argument {ma:.3f} ns/elem  "
              f"ratio {ma / ml:.2f}", flush=True)
