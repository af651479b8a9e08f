"""The native kernels' shared activation loop (c_snippets.ACT_SPAN: GEMM and conv epilogues,
activation steps) against float64, in float32 ulps, over a dense sweep of [-120, 120] and
random values: SiLU, sigmoid and quick GELU run on sigmoid_span under AVX-512 (exp16 and
rcp14 with a Newton step), documented at a few ulps; the tanh GELU as v sigmoid(2u)
(gelu_tanh16); the erf GELU on gelu16 (vecmath's erfc form in intrinsics: full relative
accuracy in the left tail too); the libmvec forms elsewhere (whose erf GELU keeps only
absolute accuracy in the left tail: not held to these bounds)."""
import ctypes

import numpy as np
import pytest
from scipy.special import ndtr

from braze.runtime.codegen import cc
from braze.runtime.kernels import c_snippets

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
""" + cc.simd_math_decls() + c_snippets.ACT_SPAN + r"""
void act_probe(const float* x, float* y, int64_t n, int act) { act_span(x, NULL, y, n, act); }
"""

A = float(np.float32(1.702))  # quick GELU's constant as float32 code holds it


def _gelu_tanh(v):
    """v / (1 + e^t), t = -2u as float32 code computes it (v * fma(v v, c1, c2), each step
    rounded to float32): t's own rounding moves e^t by up to ~|t| 2^-24 relative (160 ulps
    near v = -9.5), which no float32 form avoids; the rest is held to the bound."""
    f32 = lambda a: a.astype(np.float32).astype(np.float64)  # noqa: E731
    c1, c2 = float(np.float32(-0.0713548162726)), float(np.float32(-1.59576912160573072))
    t = f32(v * f32(f32(v * v) * c1 + c2))
    with np.errstate(over="ignore"):
        return np.where(t < 88, v / (1 + np.exp(np.minimum(t, 88))), 0.0)
REFS = {  # name: (act code, float64 reference, max ulps)
    "silu": (3, lambda v: v / (1 + np.exp(-v)), 4.0),
    "sigmoid": (5, lambda v: 1 / (1 + np.exp(-v)), 4.0),
    "gelu": (1, lambda v: v * ndtr(v), 6.0),
    "gelu_approx": (2, _gelu_tanh, 4.0),
    # the product 1.702 v is rounded to float32 before the exp, as float32 code must (its
    # rounding alone moves e^-1.702v by up to ~60 ulps near v = -40)
    "quick_gelu": (7, lambda v: v / (1 + np.exp(-(np.float32(A) * v.astype(np.float32))
                                                .astype(np.float64))), 4.0),
}


@pytest.fixture(scope="module")
def probe():
    lib = cc.load_library(SOURCE, "braze_act_probe",
                          {"act_probe": [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int]})
    if lib is None:
        pytest.skip("no C compiler here")
    return lib.act_probe


@pytest.mark.parametrize("name", sorted(REFS))
def test_activations_within_a_few_ulps(name, probe):
    code, ref, bound = REFS[name]
    if name == "gelu" and "avx512f" not in cc.cpu_flags():
        pytest.skip("the erf GELU runs libmvec's erff here (absolute accuracy in the tail)")
    x = np.concatenate([np.linspace(-120, 120, 240_001),
                        np.random.default_rng(0).standard_normal(50_001) * 8]).astype(np.float32)
    for part in (x, x[-37:].copy()):  # the masked tail of a span too
        n = part.size
        y = np.full(n, np.nan, np.float32)
        probe(part.ctypes.data, y.ctypes.data, n, code)
        want = ref(part.astype(np.float64))
        normal = np.abs(want) > np.finfo(np.float32).tiny * 2**10
        ulps = np.abs(y - want) / np.spacing(np.abs(want).astype(np.float32))
        assert not np.isnan(y).any()
        assert ulps[normal].max() <= bound, (name, float(ulps[normal].max()))
        assert np.all(np.abs(y[~normal]) <= np.finfo(np.float32).tiny * 2**11)
