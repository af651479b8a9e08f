"""ResNet basic block (ResNet-18/34) in inference form: conv3x3 -> batch_norm -> relu -> conv3x3
-> batch_norm, plus the identity (or a strided 1x1 conv + batch_norm shortcut), then relu.

Param names: `conv1.weight`, `conv2.weight` ([O, C, 3, 3], no bias), `bn1.*`, `bn2.*` with
`{gamma,beta,mean,var}` of shape [O]; when downsampling also `downsample.conv.weight`
([O, C, 1, 1]) and `downsample.bn.*`."""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.op import Value
from ..ir.shapes import Shape
from .bert import store_seed_weights

__all__ = ["resnet_basic_block"]


def _conv_bn(g: Graph, x: Value, conv: str, bn: str, c_in: int, c_out: int, k: int,
             stride: int) -> Value:
    w = g.param(f"{conv}.weight", Shape((c_out, c_in, k, k)))
    y = g.conv2d(x, w, stride=stride, padding=k // 2)
    stats = [g.param(f"{bn}.{s}", Shape((c_out,))) for s in ("gamma", "beta", "mean", "var")]
    return g.batch_norm(y, *stats, eps=1e-5)


def resnet_basic_block(
    channels: int = 64,
    hw: int = 56,
    batch: int = 1,
    downsample: bool = False,
    seed: int | None = None,
    name: str = "resnet_block",
) -> Graph:
    """One basic block on input "x" [batch, channels, hw, hw] (NCHW).

    `downsample=True` makes the first conv stride 2 with 2 * channels outputs and adds the
    1x1 stride-2 conv + batch_norm shortcut (output [batch, 2C, hw/2, hw/2]). Batch norms use
    running statistics (eps 1e-5). Params carry no weights unless `seed` is given; then
    `bz.init_params(g, seed)` values are stored."""
    c_out, stride = (2 * channels, 2) if downsample else (channels, 1)
    g = Graph(name)
    x = g.input("x", Shape((batch, channels, hw, hw)))
    h = g.relu(_conv_bn(g, x, "conv1", "bn1", channels, c_out, 3, stride))
    h = _conv_bn(g, h, "conv2", "bn2", c_out, c_out, 3, 1)
    short = _conv_bn(g, x, "downsample.conv", "downsample.bn", channels, c_out, 1, stride) \
        if downsample else x
    g.set_outputs([g.relu(g.add(h, short))])
    return store_seed_weights(g, seed)
