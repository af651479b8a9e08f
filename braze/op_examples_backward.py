"""Example graphs of the backward ops for `braze.op_examples` (same contract: input "x"
f32[2, 3, 8] is the cotangent, reshaped where needed; primals are params)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .ir.dtypes import f32
from .ir.graph import Graph
from .ir.op import Value
from .ir.shapes import Shape

__all__ = ["BACKWARD_EXAMPLES"]


def _p(g: Graph, name: str, *dims: int) -> Value:
    return g.param(name, Shape(dims, f32))


def _img(g: Graph, x: Value) -> Value:
    return g.reshape(x, (2, 4, 3, 2))


def _heads(g: Graph, x: Value) -> Value:
    return g.reshape(x, (2, 1, 3, 8))


def _two_heads(g: Graph, x: Value) -> Value:
    return g.reshape(g.concat([x, x], 1), (2, 2, 3, 8))


BACKWARD_EXAMPLES: dict[str, Callable[[Graph, Value], Value]] = {
    "relu_backward": lambda g, x: g.relu_backward(x, _p(g, "p", 2, 3, 8)),
    "activation_backward": lambda g, x: g.activation_backward(x, _p(g, "p", 2, 3, 8),
                                                              "gelu_approx"),
    "layer_norm_backward_input": lambda g, x: g.layer_norm_backward_input(
        x, _p(g, "p", 2, 3, 8), _p(g, "g", 8), eps=1e-3),
    "layer_norm_backward_gamma": lambda g, x: g.layer_norm_backward_gamma(
        x, _p(g, "p", 2, 3, 8), axis=1),
    "rms_norm_backward_input": lambda g, x: g.rms_norm_backward_input(
        x, _p(g, "p", 2, 3, 8), _p(g, "g", 8)),
    "rms_norm_backward_gamma": lambda g, x: g.rms_norm_backward_gamma(x, _p(g, "p", 2, 3, 8)),
    "rms_norm_backward_beta": lambda g, x: g.rms_norm_backward_beta(x),
    "group_norm_backward_input": lambda g, x: g.group_norm_backward_input(
        _img(g, x), _p(g, "p", 2, 4, 3, 2), 2, _p(g, "g", 4)),
    "group_norm_backward_gamma": lambda g, x: g.group_norm_backward_gamma(
        _img(g, x), _p(g, "p", 2, 4, 3, 2), 2),
    "group_norm_backward_beta": lambda g, x: g.group_norm_backward_beta(_img(g, x), 2),
    "rope_backward": lambda g, x: g.rope_backward(_heads(g, x), _p(g, "cos", 3, 2),
                                                  _p(g, "sin", 3, 2), True, 4),
    "cumsum_backward": lambda g, x: g.cumsum_backward(x, 2, exclusive=True),
    "gather_backward": lambda g, x: g.gather_backward(
        x, g.constant(np.array([2, 0, -1], np.int64)), 1, 5),
    "maxpool2d_backward": lambda g, x: g.maxpool2d_backward(
        g.reshape(x, (2, 4, 3, 2)), _p(g, "p", 2, 4, 4, 3), (2, 2), stride=(1, 2),
        padding=(0, 1, 0, 0)),
    "conv2d_backward_input": lambda g, x: g.conv2d_backward_input(
        _img(g, x), _p(g, "w", 4, 1, 2, 2), (5, 2), stride=(2, 1), padding=(0, 1, 1, 0),
        groups=2),
    "conv2d_backward_weight": lambda g, x: g.conv2d_backward_weight(
        _img(g, x), _p(g, "p", 2, 4, 5, 2), (2, 2), stride=(2, 1), padding=(0, 1, 1, 0),
        groups=2),
    "attention_backward": lambda g, x: g.attention_backward(
        _heads(g, x), _heads(g, x), _p(g, "k", 2, 1, 5, 8), _p(g, "v", 2, 1, 5, 8),
        _p(g, "m", 1, 1, 3, 5), wrt="mask", kind="bias", softcap=20.0),
    "attention_backward_all": lambda g, x: g.attention_backward_all(
        _two_heads(g, x), _two_heads(g, x), _p(g, "k", 2, 1, 3, 8), _p(g, "v", 2, 1, 3, 8),
        kind="sliding_window", window=2)[1],
}
