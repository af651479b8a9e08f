"""Backward ops of the convolution family (NCHW): conv2d_backward_input (a transposed
convolution of dy), conv2d_backward_weight (dy correlated with the input's windows) and
maxpool2d_backward (dy routed to the first maximum of each window, overlapping windows adding).

Composites like the other backward ops: a NumPy reference plus a decomposition into pad / slice /
concat / matmul / conv_transpose2d primitives. Inputs are `dy` first, then what the forward
op's gradient reads; the forward's attributes are copied onto the op."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..op import Op, require, same_dtype
from ..shapes import Shape
from .conv import ConvTranspose2d, _check_attrs, _compute_dtype, _pad, _windows

__all__ = ["Conv2dBackwardInput", "Conv2dBackwardWeight", "MaxPool2dBackward",
           "transpose_output_padding"]


def transpose_output_padding(size: int, out: int, k: int, stride: int, lo: int, hi: int,
                             dilation: int) -> int:
    """The conv_transpose2d output_padding that maps `out` positions back onto `size` (the rows
    a strided window never reached at the end)."""
    return size + lo + hi - ((out - 1) * stride + dilation * (k - 1) + 1)


def _static_image(op: Op, s: Shape, what: str) -> None:
    require(s.rank == 4, f"{op.kind} {what} must be [N, C, H, W], got {s}")
    require(all(isinstance(d, int) for d in s.dims[1:]),
            f"{op.kind} needs static channel and spatial dims, got {what} {s}")


@dataclass(frozen=True)
class _ConvBackward(Op):
    """Attributes of the forward conv2d (see Conv2d) shared by both gradients."""

    arity = 2
    composite = True
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1

    def check(self, dy: Shape, other: Shape) -> None:
        same_dtype(self, (dy, other))
        require(dy.dtype.is_float, f"{self.kind} needs float inputs, got {dy.dtype}")
        _check_attrs(self, stride=self.stride, padding=self.padding, dilation=self.dilation,
                     groups=(self.groups,))
        _static_image(self, dy, "dy")

    def out_len(self, size: int, k: int, i: int) -> int:
        span = self.dilation[i] * (k - 1) + 1
        return (size + self.padding[i] + self.padding[i + 2] - span) // self.stride[i] + 1


@dataclass(frozen=True)
class Conv2dBackwardInput(_ConvBackward):
    """d x [N, C, H, W] of conv2d from (dy [N, O, Ho, Wo], w [O, C/groups, kh, kw]); `input_hw`
    is the forward input's (H, W), which dy's size alone does not determine."""

    kind = "conv2d_backward_input"
    input_hw: tuple[int, int] = (1, 1)

    def infer(self, ins):
        dy, w = ins
        self.check(dy, w)
        _static_image(self, w, "weight")
        o, cg, kh, kw = w.dims
        require(dy.dims[1] == o and o % self.groups == 0,
                f"{self.kind}: dy {dy} must have the weight's {o} output channels, divisible by "
                f"groups {self.groups}")
        h, wd = self.input_hw
        require(dy.dims[2:] == (self.out_len(h, kh, 0), self.out_len(wd, kw, 1)),
                f"{self.kind}: dy {dy} is not conv2d's output size for input {self.input_hw}")
        return Shape((dy.dims[0], cg * self.groups, h, wd), dy.dtype)

    def transposed(self, w_dims) -> ConvTranspose2d:
        kh, kw = w_dims[2:]
        ho = self.out_len(self.input_hw[0], kh, 0)
        wo = self.out_len(self.input_hw[1], kw, 1)
        t, left, b, r = self.padding
        op = (transpose_output_padding(self.input_hw[0], ho, kh, self.stride[0], t, b,
                                       self.dilation[0]),
              transpose_output_padding(self.input_hw[1], wo, kw, self.stride[1], left, r,
                                       self.dilation[1]))
        return ConvTranspose2d(self.stride, self.padding, op, self.dilation, self.groups)

    def reference(self, dy, w):
        return self.transposed(w.shape).reference(dy, w)

    def decompose(self, g, ins):
        dy, w = ins
        return g.add_node(self.transposed(g.shape_of(w).dims), (dy, w))[0]


@dataclass(frozen=True)
class Conv2dBackwardWeight(_ConvBackward):
    """d w [O, C/groups, kh, kw] of conv2d from (dy [N, O, Ho, Wo], x [N, C, H, W]); `kernel`
    is (kh, kw)."""

    kind = "conv2d_backward_weight"
    kernel: tuple[int, int] = (1, 1)

    def infer(self, ins):
        dy, x = ins
        self.check(dy, x)
        _static_image(self, x, "x")
        o, c = dy.dims[1], x.dims[1]
        require(o % self.groups == 0 and c % self.groups == 0,
                f"{self.kind}: channels {c} -> {o} do not split into {self.groups} groups")
        kh, kw = self.kernel
        require(dy.dims[0] == x.dims[0] and dy.dims[2:] == (
            self.out_len(x.dims[2], kh, 0), self.out_len(x.dims[3], kw, 1)),
            f"{self.kind}: dy {dy} is not conv2d's output for x {x} and kernel {self.kernel}")
        return Shape((o, c // self.groups, kh, kw), dy.dtype)

    def reference(self, dy, x):
        ct = _compute_dtype(x.dtype)
        kh, kw = self.kernel
        v = _windows(_pad(x.astype(ct, copy=False), self.padding), kh, kw, self.stride,
                     self.dilation)  # [N, C, Ho, Wo, kh, kw]
        o, c, gs = dy.shape[1], x.shape[1], self.groups
        og, cg = o // gs, c // gs
        dyc = dy.astype(ct, copy=False)
        out = np.concatenate([
            np.tensordot(dyc[:, i * og:(i + 1) * og], v[:, i * cg:(i + 1) * cg],
                         axes=([0, 2, 3], [0, 2, 3])) for i in range(gs)])
        return out.astype(dy.dtype, copy=False)

    def decompose(self, g, ins):
        dy, x = ins
        n, c, h, wd = g.shape_of(x).dims
        _, o, ho, wo = g.shape_of(dy).dims
        require(isinstance(n, int), f"{self.kind} decomposes only with a static batch, got {n!r}")
        kh, kw = self.kernel
        gs, k = self.groups, kh * kw
        t, left, b, r = self.padding
        xp = g.pad(x, ((0, 0), (0, 0), (t, b), (left, r))) if any(self.padding) else x
        (sh, sw), (dh, dw) = self.stride, self.dilation
        taps = []
        for i in range(kh):
            rows = g.slice(xp, 2, i * dh, i * dh + (ho - 1) * sh + 1, sh)
            for j in range(kw):
                tap = g.slice(rows, 3, j * dw, j * dw + (wo - 1) * sw + 1, sw)
                taps.append(g.reshape(tap, (n, c, 1, ho, wo)))
        stacked = g.concat(taps, 2) if k > 1 else taps[0]  # [N, C, K, Ho, Wo]
        m, cg, og = n * ho * wo, c // gs, o // gs
        cols = g.reshape(g.transpose(g.reshape(stacked, (n, gs, cg * k, ho * wo)), (1, 0, 3, 2)),
                         (gs, m, cg * k))
        rows_dy = g.reshape(g.transpose(g.reshape(dy, (n, gs, og, ho * wo)), (1, 2, 0, 3)),
                            (gs, og, m))
        return g.reshape(g.matmul(rows_dy, cols), (o, cg, kh, kw))


@dataclass(frozen=True)
class MaxPool2dBackward(Op):
    """d x of max pooling from (dy [N, C, Ho, Wo], x [N, C, H, W]): each window's cotangent goes
    to its first maximum in row-major window order (PyTorch's choice on ties); a position that
    is the maximum of several overlapping windows receives their sum."""

    kind = "maxpool2d_backward"
    arity = 2
    composite = True
    kernel: tuple[int, int] = (2, 2)
    stride: tuple[int, int] = (2, 2)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)

    def forward(self):
        from .conv import Pool2d, PoolKind

        return Pool2d(PoolKind.MAX, self.kernel, self.stride, self.padding)

    def infer(self, ins):
        dy, x = ins
        same_dtype(self, ins)
        require(x.dtype.is_float, f"{self.kind} needs float inputs, got {x.dtype}")
        _static_image(self, x, "x")
        want = self.forward().infer((x,))
        require(dy.dims == want.dims, f"{self.kind}: dy {dy} must be max_pool2d's output {want}")
        return x

    def reference(self, dy, x):
        kh, kw = self.kernel
        t, left = self.padding[:2]
        ct = _compute_dtype(x.dtype)
        xp = _pad(x.astype(ct, copy=False), self.padding, -np.inf)
        v = _windows(xp, kh, kw, self.stride, (1, 1))
        n, c, ho, wo = v.shape[:4]
        first = v.reshape(n, c, ho, wo, kh * kw).argmax(axis=-1)
        rows = np.arange(ho)[:, None] * self.stride[0] + first // kw
        cols = np.arange(wo)[None, :] * self.stride[1] + first % kw
        dxp = np.zeros(xp.shape, ct)
        ni, ci = np.ogrid[:n, :c]
        np.add.at(dxp, (ni[..., None, None], ci[..., None, None], rows, cols),
                  dy.astype(ct, copy=False))
        h, wd = x.shape[2:]
        return dxp[:, :, t:t + h, left:left + wd].astype(dy.dtype, copy=False)

    def decompose(self, g, ins):
        dy, x = ins
        n, c, h, wd = g.shape_of(x).dims
        ho, wo = g.shape_of(dy).dims[2:]
        (kh, kw), (sh, sw) = self.kernel, self.stride
        t, left, b, r = self.padding
        xp = g.pad(x, ((0, 0), (0, 0), (t, b), (left, r)), -math.inf) if any(self.padding) \
            else x
        y = g.add_node(self.forward(), (x,))[0]
        taken, picks = None, []
        for i in range(kh):
            rows = g.slice(xp, 2, i, i + (ho - 1) * sh + 1, sh)
            for j in range(kw):
                hit = g.eq(g.slice(rows, 3, j, j + (wo - 1) * sw + 1, sw), y)
                first = hit if taken is None else g.logical_and(hit, g.logical_not(taken))
                taken = hit if taken is None else g.logical_or(taken, hit)
                picks.append(g.reshape(g.where(first, dy, 0.0), (n, c, 1, ho, wo)))
        k = kh * kw
        stacked = g.reshape(g.concat(picks, 2) if k > 1 else picks[0], (n, c * k, ho, wo))
        onehot = np.zeros((c, k, 1, kh, kw), g.shape_of(x).dtype.np)
        onehot[:, np.arange(k), 0, np.arange(k) // kw, np.arange(k) % kw] = 1
        out_pad = (transpose_output_padding(h, ho, kh, sh, t, b, 1),
                   transpose_output_padding(wd, wo, kw, sw, left, r, 1))
        kernel = g.constant(onehot.reshape(c * k, 1, kh, kw), g.shape_of(x).dtype)
        return g.conv_transpose2d(stacked, kernel,
                                  stride=self.stride, padding=self.padding,
                                  output_padding=out_pad, groups=c)
