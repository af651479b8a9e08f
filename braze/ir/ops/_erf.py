"""Accurate vectorized erf for the reference interpreter (numba-compiled `math.erf`)."""
from __future__ import annotations

import math

import numpy as np

_ufunc = None


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise erf with libm accuracy, preserving float dtypes."""
    global _ufunc
    if _ufunc is None:
        import numba

        @numba.vectorize(["float64(float64)", "float32(float32)"], cache=True)
        def _erf(v):
            return math.erf(v)

        _ufunc = _erf
    x = np.asarray(x)
    if x.dtype in (np.float32, np.float64):
        return _ufunc(x)
    return _ufunc(x.astype(np.float32)).astype(x.dtype)
