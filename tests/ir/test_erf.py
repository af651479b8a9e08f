"""The reference erf: NumPy only (no JIT start-up), libm accuracy."""
import math

import numpy as np

from braze.ir.ops._erf import erf


def test_erf_matches_libm_to_1e13():
    x = np.concatenate([np.linspace(-8, 8, 40001), [0.0, -0.0, 1e-30, 0.5, 1.5, 3.0, 30.0]])
    want = np.array([math.erf(v) for v in x])
    assert np.abs(erf(x) - want).max() < 1e-13


def test_erf_special_values_and_dtypes():
    out = erf(np.array([np.inf, -np.inf, np.nan]))
    assert out[0] == 1 and out[1] == -1 and np.isnan(out[2])
    for dt in (np.float32, np.float16):
        y = erf(np.linspace(-2, 2, 7).astype(dt))
        assert y.dtype == dt
        np.testing.assert_allclose(y, [math.erf(v) for v in np.linspace(-2, 2, 7)], rtol=1e-3)
