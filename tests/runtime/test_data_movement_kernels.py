"""Strided-slice and constant-pad kernels against the reference interpreter (odd sizes,
negative steps and bounds, a symbolic batch), and the dispatch report lists them as native;
reflect padding still runs its reference."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.shape import PadMode
from braze.runtime.kernels import Dispatch


def _compiled(g, symbols=None):
    exe = bz.compile(g, fuse=False)
    for seed in (0, 1):
        feeds = bz.random_feeds(g, seed, symbols)
        for got, want in zip(exe(feeds), bz.interpret(g, feeds), strict=True):
            np.testing.assert_array_equal(got, want)
    return {kind: d for _, kind, d, _ in exe.dispatch_report().rows}


@pytest.mark.parametrize("axis,start,stop,step", [(1, 0, 7, 2), (2, 1, 9, 2), (-1, -1, -10, -3),
                                                  (1, 5, 0, -1)])
def test_strided_slices_match_the_interpreter(axis, start, stop, step):
    g = bz.Graph("slice")
    x = g.input("x", bz.Shape(("batch", 7, 9)))
    g.set_outputs([g.mul(g.slice(x, axis, start, stop, step), g.constant(np.float32(2.0)))])
    kinds = _compiled(g, {"batch": 3})
    assert kinds["slice"] == Dispatch.NATIVE


@pytest.mark.parametrize("pads,value", [(((0, 0), (0, 0), (0, 1), (0, 1)), 0.0),
                                        (((0, 0), (1, 2), (3, 0), (2, 1)), -1.5),
                                        (((0, 0),) * 4, 0.0)])
def test_constant_pads_match_the_interpreter(pads, value):
    g = bz.Graph("pad")
    x = g.input("x", bz.Shape(("batch", 3, 5, 6)))
    g.set_outputs([g.relu(g.pad(x, pads, value))])
    kinds = _compiled(g, {"batch": 2})
    assert kinds["pad"] in (Dispatch.NATIVE, Dispatch.VIEW)


def test_reflect_pad_runs_its_reference():
    g = bz.Graph("reflect")
    x = g.input("x", bz.Shape((2, 3, 5, 6)))
    g.set_outputs([g.relu(g.pad(x, ((0, 0), (0, 0), (1, 1), (2, 2)), mode=PadMode.REFLECT))])
    assert _compiled(g)["pad"] == Dispatch.REFERENCE
