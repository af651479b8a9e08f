"""One small example graph per op kind, shared by every registry-driven test (printer/parser
round trips, ONNX export, kernels, autodiff): `example_graph(kind)` builds a graph with input
"x" f32[2, 3, 8] whose output is one node of that kind. A registry-completeness test fails when a
kind has no example."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .ir.dtypes import f32, i32, i64, u8
from .ir.graph import Graph
from .ir.op import Value
from .ir.ops.indexing import DynamicNarrow
from .ir.shapes import Shape
from .op_examples_backward import BACKWARD_EXAMPLES

__all__ = ["OP_EXAMPLES", "example_graph", "example_input_shape", "body_graph"]


def example_input_shape() -> Shape:
    return Shape((2, 3, 8), f32)


def _s(*dims, dtype=f32):
    return Shape(dims, dtype)


def _attn_block(g, x):
    return g.fused_attention_block(x, g.param("wqkv", _s(8, 24)), g.param("wo", _s(8, 8)),
                                   num_heads=2, mask_kind="causal", scale=0.25)


def _transformer(g, x):
    scratch = Graph("scratch")
    attn = scratch.node(_attn_block(scratch, scratch.input("x", _s(2, 3, 8)))).op
    p = lambda n, *d: g.param(n, _s(*d))  # noqa: E731
    ins = {"w_qkv": p("wqkv", 8, 24), "w_o": p("wo", 8, 8), "norm1_gamma": p("g1", 8),
           "norm1_beta": p("b1n", 8), "w1": p("w1", 8, 16), "b1": p("b1", 16),
           "w2": p("w2", 16, 8), "b2": p("b2", 8), "norm2_gamma": p("g2", 8),
           "norm2_beta": p("b2n", 8)}
    return g.fused_transformer_layer(x, ins, attn=attn, style="post_norm", mlp="gelu_approx")


def _region(g, x):
    body = Graph("body")
    body.set_outputs([body.silu(body.input("in0", _s(2, 3, 8)))])
    return g.elementwise_region(body, [x])


def body_graph(name: str, in_shapes, body: Callable) -> Graph:
    """A graph (a control-flow body) with inputs in0, in1, ... of `in_shapes` whose outputs
    are what `body(g, *inputs)` returns (one value or a tuple)."""
    g = Graph(name)
    outs = body(g, *[g.input(f"in{i}", s) for i, s in enumerate(in_shapes)])
    g.set_outputs(list(outs) if isinstance(outs, tuple) else [outs])
    return g


def _if(g, x):
    then_g = body_graph("then", [_s(2, 3, 8)], lambda b, v: b.mul(b.tanh(v), 2.0))
    else_g = body_graph("else", [_s(2, 3, 8)], lambda b, v: b.mul(v, v))
    return g.cond(g.gt(g.sum(x), 0.0), then_g, else_g, x)


def _while(g, x):
    carried = [_s(dtype=i32), _s(2, 3, 8)]
    cond = body_graph("cond", carried, lambda b, i, v: b.lt(i, 3))
    body = body_graph("body", carried,
                      lambda b, i, v: (b.add(i, 1), b.add(b.mul(v, 0.5), b.tanh(v))))
    return g.while_loop(cond, body, g.constant(np.array(0, np.int32)), x, max_iterations=5)[1]


def _custom_fn(g, x):
    fwd = body_graph("fwd", [_s(2, 3, 8)], lambda b, v: b.tanh(v))
    vjp = body_graph("vjp", [_s(2, 3, 8)] * 3,
                     lambda b, v, y, ct: b.mul(ct, b.sub(1.0, b.mul(y, y))))
    return g.custom_fn([x], fwd, vjp_body=vjp)


def _dequantize(g, x):
    q = g.constant(np.arange(-24, 24, dtype=np.int8).reshape(2, 3, 8) * 5)
    scale = g.mul(g.exp(g.mean(x, (0, 1))), 0.01)  # per-channel, a function of x
    return g.dequantize(q, scale, g.constant(np.arange(8, dtype=np.int8) - 4), axis=2)


def _scan(g, x):
    body = body_graph("step", [_s(3, 8)] * 3,
                      lambda b, c, w, x_t: (b.tanh(b.add(b.mul(c, w), x_t)), b.add(c, x_t)))
    init = g.mul(g.sum(x, (0,)), 0.5)
    return g.scan_general(body, init, 2, bcasts=[g.param("w", _s(3, 8))], xs=[x])[1]


# kind -> builder of one node of that kind from x: f32[2, 3, 8] (param shapes as needed)
OP_EXAMPLES: dict[str, Callable[[Graph, Value], Value]] = {
    "input": lambda g, x: x,
    "param": lambda g, x: g.param("p", _s(8)),
    "constant": lambda g, x: g.constant(np.arange(6, dtype=np.int32).reshape(2, 3)),
    "unary": lambda g, x: g.silu(x),
    "binary": lambda g, x: g.pow(x, 2.0),
    "compare": lambda g, x: g.ge(x, 0.0),
    "where": lambda g, x: g.where(g.lt(x, 0.0), x, 1.0),
    "cast": lambda g, x: g.cast(x, i64),
    "leaky_relu": lambda g, x: g.leaky_relu(x, 0.1),
    "clamp": lambda g, x: g.clamp(x, -0.5, 0.5),
    "matmul": lambda g, x: g.mm(x, g.param("w", _s(8, 5))),
    "dot_general": lambda g, x: g.dot_general(x, g.param("w", _s(2, 8, 5)), (2,), (1,),
                                              (0,), (0,)),
    "reshape": lambda g, x: g.reshape(x, (6, -1)),
    "transpose": lambda g, x: g.transpose(x, (2, 0, 1)),
    "narrow": lambda g, x: g.narrow(x, 2, 1, 4),
    # a symbolic start in the static example's terms ("8-s" with s bound would need a symbol)
    "dynamic_narrow": lambda g, x: g.add_node(DynamicNarrow(2, 1, 4), (x,))[0],
    "concat": lambda g, x: g.concat([x, x], 1),
    "expand": lambda g, x: g.expand(g.reshape(x, (2, 1, 3, 8)), (2, 5, 3, 8)),
    "gather": lambda g, x: g.gather(x, g.constant(np.array([2, 0, 1, 2], np.int64)), 1),
    "pad": lambda g, x: g.pad(x, ((0, 1), (2, 3), (0, 0)), 0.5),
    "split": lambda g, x: g.split(x, 2, (3, 5))[1],
    "reduce": lambda g, x: g.mean(x, (1,)),
    "softmax": lambda g, x: g.softmax(x, 1),
    "cumsum": lambda g, x: g.cumsum(x, 2, exclusive=True, reverse=True),
    "argmax": lambda g, x: g.argmax(x, 2, keepdims=True),
    "layer_norm": lambda g, x: g.layer_norm(x, g.param("g", _s(8)), eps=1e-3),
    "rms_norm": lambda g, x: g.rms_norm(x, g.param("g", _s(8)), g.param("b", _s(8))),
    "group_norm": lambda g, x: g.group_norm(g.reshape(x, (2, 4, 3, 2)), 2),
    "batch_norm": lambda g, x: g.batch_norm(g.reshape(x, (2, 4, 3, 2)),
                                            *[g.param(n, _s(4)) for n in "abcd"]),
    "attention": lambda g, x: g.attention(*[g.reshape(x, (2, 1, 3, 8))] * 3, kind="causal",
                                          softcap=30.0),
    "rope": lambda g, x: g.rope_n(g.reshape(x, (2, 1, 3, 8)), g.param("cos", _s(3, 2)),
                                  g.param("sin", _s(3, 2)), 4),
    "conv2d": lambda g, x: g.conv2d(g.reshape(x, (2, 4, 3, 2)), g.param("w", _s(6, 2, 1, 1)),
                                    stride=(2, 1), padding=(0, 1, 0, 1), groups=2),
    "conv_transpose2d": lambda g, x: g.conv_transpose2d(g.reshape(x, (2, 4, 3, 2)),
                                                        g.param("w", _s(4, 3, 2, 2)), stride=2),
    "pool2d": lambda g, x: g.avg_pool2d(g.reshape(x, (2, 4, 3, 2)), 2, 1,
                                        count_include_pad=True),
    "global_avg_pool": lambda g, x: g.global_avg_pool(g.reshape(x, (2, 4, 3, 2))),
    "resize_nearest_2x": lambda g, x: g.resize_nearest_2x(g.reshape(x, (2, 4, 3, 2))),
    "resize": lambda g, x: g.resize(g.reshape(x, (2, 4, 3, 2)), (5, 3), "linear",
                                    "pytorch_half_pixel"),
    "fused_matmul_bias_act": lambda g, x: g.linear_fused(x, g.param("w", _s(8, 4)),
                                                         g.param("b", _s(4)), "relu"),
    "fused_swiglu": lambda g, x: g.fused_swiglu(x, gate_first=False),
    "fused_residual_ln": lambda g, x: g.fused_residual_ln(x, x, g.param("g", _s(8)),
                                                          expose_sum=True)[1],
    "fused_residual_rms_norm": lambda g, x: g.fused_residual_rms_norm(x, x, eps=1e-4),
    "fused_rms_norm_reshape": lambda g, x: g.fused_rms_norm_reshape(x, (2, 3, 2, 4)),
    "fused_conv_bias_act": lambda g, x: g.fused_conv_bias_act(
        g.reshape(x, (2, 4, 3, 2)), g.param("w", _s(3, 4, 1, 1)), g.param("b", _s(3)),
        act="silu"),
    "fused_attention_block": _attn_block,
    "fused_transformer_layer": _transformer,
    "elementwise_region": _region,
    "if": _if,
    "while": _while,
    "custom_fn": _custom_fn,
    "scan": _scan,
    "log_softmax": lambda g, x: g.log_softmax(x, 1),
    "isnan": lambda g, x: g.isnan(g.log(x)),
    "stop_gradient": lambda g, x: g.stop_gradient(g.tanh(x)),
    "isinf": lambda g, x: g.isinf(g.div(x, 0.0), detect_positive=False),
    "range": lambda g, x: g.arange(5, start=2, delta=3, dtype=i32),
    "sym_const": lambda g, x: g.sym_const((2, 3, 8), dtype=i64),
    "slice": lambda g, x: g.slice(x, 2, 7, 0, -2),
    "gather_elements": lambda g, x: g.gather_elements(
        x, g.constant(np.array([[[1], [0], [2]]] * 2, np.int64)), 2),
    "top_k": lambda g, x: g.top_k(x, 3, axis=2, largest=False)[1],
    "trilu": lambda g, x: g.trilu(x, upper=False, k=1),
    "quantize": lambda g, x: g.quantize(x, 0.05, 3),
    "dequantize": _dequantize,
    "dynamic_quant_matmul": lambda g, x: g.dynamic_quant_matmul(
        x, g.constant((np.arange(32) * 37 % 255 - 127).astype(np.int8).reshape(8, 4)),
        g.constant(np.linspace(0.01, 0.04, 4, dtype=np.float32)), g.param("b", _s(4)), "gelu"),
    "fake_quantize": lambda g, x: g.fake_quantize(x, np.linspace(0.004, 0.02, 8), 128, axis=2,
                                                  dtype=u8),
    **BACKWARD_EXAMPLES,
    "softmax_cross_entropy": lambda g, x: g.softmax_cross_entropy(
        x, g.constant(np.array([[1, 7, 0], [3, 2, 5]], np.int64))),
    "softmax_cross_entropy_backward": lambda g, x: g.softmax_cross_entropy_backward(
        x, g.softmax(g.mul(x, 2.0)), g.sum(x, -1), reduction="none"),
}


def example_graph(kind: str) -> Graph:
    """A graph with input "x" f32[2, 3, 8] and one output: a node of `kind`."""
    g = Graph(f"one_{kind}")
    x = g.input("x", example_input_shape())
    g.set_outputs([OP_EXAMPLES[kind](g, x)])
    return g
