"""Gradient checks of the convolution-family rules: conv2d (stride, padding, dilation, groups,
bias), conv_transpose2d (stride, output_padding, groups), max and average pooling (padding,
overlapping windows, count_include_pad), global average pooling and 2x nearest upsampling.
Finite differences in reverse and forward mode, order 2 where the op is smooth, and torch."""
from __future__ import annotations

import numpy as np
import pytest
from check_grads import build, check_grads, random_feeds, weighted_loss

import braze as bz
from braze.autodiff import grad_with_loss

ROWS = [
    ("conv2d_bias", lambda g, x, w, b: g.conv2d(x, w, b), [(2, 3, 5, 4), (4, 3, 2, 2), (4,)], 2),
    ("conv2d_groups_stride_pad_dil",
     lambda g, x, w: g.conv2d(x, w, stride=(2, 1), padding=(1, 0, 0, 1), dilation=(1, 2),
                              groups=2), [(1, 4, 7, 6), (6, 2, 3, 2)], 2),
    ("conv_transpose2d",
     lambda g, x, w, b: g.conv_transpose2d(x, w, b, stride=2, padding=(1, 0, 0, 1),
                                           output_padding=1), [(1, 2, 3, 4), (2, 3, 3, 2), (3,)],
     2),
    ("conv_transpose2d_groups",
     lambda g, x, w: g.conv_transpose2d(x, w, stride=(1, 2), groups=2, dilation=(2, 1)),
     [(2, 4, 3, 3), (4, 1, 2, 2)], 1),
    ("fused_conv_residual_tanh",  # act(conv + b + r): through its decomposition
     lambda g, x, w, b, r: g.fused_conv_bias_act(x, w, b, padding=1, act="tanh", residual=r),
     [(2, 3, 5, 4), (4, 3, 3, 3), (4,), (2, 4, 5, 4)], 2),
    ("max_pool", lambda g, x: g.max_pool2d(x, 2, 2), [(2, 3, 4, 6)], 1),
    ("max_pool_overlap_pad", lambda g, x: g.max_pool2d(x, 3, 1, padding=1), [(1, 2, 5, 4)], 1),
    ("avg_pool_pad", lambda g, x: g.avg_pool2d(x, 3, 2, padding=1), [(1, 2, 5, 6)], 2),
    ("avg_pool_count_pad", lambda g, x: g.avg_pool2d(x, (2, 3), 1, padding=(1, 1),
                                                     count_include_pad=True), [(1, 2, 4, 5)], 1),
    ("global_avg_pool", lambda g, x: g.global_avg_pool(x), [(2, 3, 4, 5)], 2),
    ("resize_nearest_2x", lambda g, x: g.resize_nearest_2x(x), [(1, 2, 3, 4)], 2),
    # the general resize in float64: its VJP's resampling matrices take the input's dtype
    ("resize_linear", lambda g, x: g.resize(x, (7, 3), "linear", "pytorch_half_pixel"),
     [(1, 2, 4, 5)], 2),
    ("resize_cubic_align_corners", lambda g, x: g.resize(x, (2, 9), "cubic", "align_corners"),
     [(1, 2, 4, 5)], 1),
    ("resize_nearest", lambda g, x: g.resize(x, (7, 3), "nearest", "asymmetric", "floor"),
     [(1, 2, 4, 5)], 1),
]


@pytest.mark.parametrize("name, fn, shapes, order", ROWS, ids=[r[0] for r in ROWS])
def test_conv_family_gradients_match_finite_differences(name, fn, shapes, order):
    check_grads(fn, shapes, order=order, rtol=1e-5, atol=1e-6, name=name)


def test_conv2d_reverse_mode_uses_the_backward_ops():
    g = build(ROWS[0][1], ROWS[0][2])
    loss, _ = weighted_loss(g, 0)
    kinds = {n.op.kind for n in grad_with_loss(loss, ["x0", "x1", "x2"]).nodes}
    assert {"conv2d_backward_input", "conv2d_backward_weight"} <= kinds


def test_conv_and_pool_gradients_match_torch():
    torch = pytest.importorskip("torch")
    shapes = [(2, 4, 7, 6), (6, 2, 3, 2), (6,)]

    def fn(g, x, w, b):
        return g.max_pool2d(g.conv2d(x, w, b, stride=(1, 2), padding=1, groups=2), 2, 1)

    g = build(fn, shapes)
    loss, (r,) = weighted_loss(g, 0)
    feeds = random_feeds(shapes, 0)
    got = bz.interpret(grad_with_loss(loss, ["x0", "x1", "x2"]), feeds, float64=True)[1:]
    ts = [torch.tensor(feeds[f"x{i}"], requires_grad=True) for i in range(3)]
    y = torch.nn.functional.conv2d(*ts, stride=(1, 2), padding=1, groups=2)
    (torch.nn.functional.max_pool2d(y, 2, 1) * torch.tensor(r)).sum().backward()
    for a, t in zip(got, ts):
        np.testing.assert_allclose(a, t.grad.numpy(), rtol=1e-9, atol=1e-10)
