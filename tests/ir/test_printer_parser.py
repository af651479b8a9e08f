"""Text IR: `str(g)` shows ops, attributes, values, types, names and provenance, and
`Graph.parse(str(g)) == g` holds exactly, for every op kind."""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings

import braze as bz
from braze.ir.equality import graph_diff
from braze.ir.op import OP_REGISTRY
from braze.op_examples import OP_EXAMPLES, example_graph
from braze.testing import random_graphs


def round_trip(g: bz.Graph) -> bz.Graph:
    text = str(g)
    back = bz.Graph.parse(text)
    assert graph_diff(g, back) is None, text
    assert back == g
    assert str(back) == text
    return back


def bert_like() -> bz.Graph:
    g = bz.Graph("bert_layer")
    x = g.input("hidden", bz.Shape(("batch", "seq", 384)))
    w = g.param("w", bz.Shape((384, 1152)))
    b = g.param("b", bz.Shape((1152,)))
    y = g.gelu(g.add(g.mm(x, w), b))
    g.set_outputs([y])
    return g


def test_text_shows_header_ops_types_and_provenance():
    g = bert_like()
    lines = str(g).splitlines()
    assert lines[0] == ("graph bert_layer(%hidden: f32[batch, seq, 384]) "
                        "params(%w: f32[384, 1152], %b: f32[1152]) {")
    assert lines[1].startswith("  %hidden = input") and "# test_printer_parser.py:" in lines[1]
    assert lines[4].startswith("  %3 = matmul(%hidden, %w) -> f32[batch, seq, 1152]")
    assert lines[6].startswith("  %5 = gelu(%4) -> f32[batch, seq, 1152]")
    assert lines[-2:] == ["  return %5", "}"]
    back = round_trip(g)
    assert back.node(5).provenance == g.node(5).provenance


def test_multi_output_values_print_with_index_and_round_trip():
    g = bz.Graph("split")
    x = g.input("x", bz.Shape(("b", 4, 6), bz.f16))
    a, b = g.split(x, 2, (2, 4))
    g.set_outputs([b, a, b])
    text = str(g)
    assert "%1 = split[axis=2, sizes=(2, 4)](%x) -> (f16[b, 4, 2], f16[b, 4, 4])" in text
    assert "return %1.1, %1, %1.1" in text
    round_trip(g)


@pytest.mark.parametrize("dtype", bz.ALL_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("size", [1, 5, 40])
def test_constants_round_trip_bit_exactly(dtype, size):
    rng = np.random.default_rng(size)
    raw = rng.standard_normal(size) * 100
    if dtype.kind == "bool":
        arr = raw > 0
    elif dtype.kind == "complex":
        arr = (raw + 1j * raw[::-1]).astype(dtype.np)
    else:
        arr = raw.astype(dtype.np)
    if dtype.is_float and size > 1:
        arr[0], arr[1] = -0.0, np.inf
    g = bz.Graph("consts")
    c = g.constant(arr.reshape((size,)) if size > 1 else arr.reshape(()), dtype)
    g.set_outputs([c])
    back = round_trip(g)
    got = back.node(0).op.value
    assert got.dtype == dtype.np and got.tobytes() == g.node(0).op.value.tobytes()


def test_small_constants_print_inline_and_large_as_base64():
    g = bz.Graph("c")
    small = g.constant(np.array([1.5, -0.0], np.float32))
    big = g.constant(np.arange(64, dtype=np.float32).astype(ml_dtypes.bfloat16))
    nan = g.constant(np.array([np.nan], np.float32))
    g.set_outputs([small, big, nan])
    text = str(g)
    assert "constant[value=f32[2]{1.5, -0.0}]() -> f32[2]" in text
    assert 'constant[value=bf16[64]{"' in text
    assert 'constant[value=f32[1]{"' in text  # NaN bits only survive as raw bytes
    round_trip(g)


def test_odd_names_provenance_and_source_order_survive():
    g = bz.Graph("my model/v2")
    x = g.input("encoder.layer.0", bz.Shape((2, 3)))
    h = g.add_node(_unary("tanh"), (x,), name="3", provenance=' # odd "prov"  ')[0]
    w = g.param("w eight", bz.Shape((3, 3)))  # a param created after compute nodes
    y = g.add_node(_unary("neg"), (g.mm(h, w),), name="return", provenance="")[0]
    z = g.add_node(_unary("abs"), (y,), name="n\n2", provenance="line1\nline2 # x")[0]
    t = g.input("t", bz.Shape((2, 3)))
    g.set_outputs([z, t])
    g.input_ids.reverse()  # input order differs from node order
    text = str(g)
    assert text.startswith('graph "my model/v2"(%t: f32[2, 3], %"encoder.layer.0": f32[2, 3])')
    assert '%"3" = tanh(%"encoder.layer.0")' in text
    back = round_trip(g)
    assert [n.provenance for n in back.nodes] == [n.provenance for n in g.nodes]
    assert back.input_ids == g.input_ids


def _unary(fn: str) -> bz.Op:
    from braze.ir.ops.elementwise import Unary, UnaryFn

    return Unary(UnaryFn(fn))


def test_attributes_at_their_default_are_left_out_but_others_print():
    g = bz.Graph("attrs")
    x = g.input("x", bz.Shape((2, 3, 4)))
    g.set_outputs([g.leaky_relu(x), g.leaky_relu(x, 0.2), g.cast(x, bz.bf16),
                   g.reduce(x, "sum", (0, 2), keepdims=True), g.clamp(x, -1.0, float("inf"))])
    text = str(g)
    assert "= leaky_relu(%x)" in text and "leaky_relu[alpha=0.2](%x)" in text
    assert "cast[dtype=bf16](%x) -> bf16[2, 3, 4]" in text
    assert "reduce_sum[axes=(0, 2), keepdims=true](%x) -> f32[1, 3, 1]" in text
    assert "clamp[lo=-1.0, hi=inf](%x)" in text
    round_trip(g)


def test_region_bodies_print_nested_and_round_trip():
    from braze.ir.ops.region import ElementwiseRegion

    body = bz.Graph("body")
    a = body.input("in0", bz.Shape(("n", 4)))
    b = body.input("in1", bz.Shape((4,)))
    body.set_outputs([body.gelu(body.add(a, b)), body.mul(a, 0.5)])
    g = bz.Graph("outer")
    x = g.input("x", bz.Shape(("n", 4)))
    w = g.param("w", bz.Shape((4,)))
    y0, y1 = g.add_node(ElementwiseRegion(body), (x, w), name="region", provenance="fuse")
    g.set_outputs([y0, y1])
    text = str(g)
    assert "%region = elementwise_region[body=graph body(%in0: f32[n, 4], %in1: f32[4])" in text
    assert "\n      %2 = add(%in0, %in1) -> f32[n, 4]" in text
    back = round_trip(g)
    changed = bz.Graph("body")
    a = changed.input("in0", bz.Shape(("n", 4)))
    b = changed.input("in1", bz.Shape((4,)))
    changed.set_outputs([changed.gelu(changed.sub(a, b)), changed.mul(a, 0.5)])
    other = bz.Graph("outer")
    x = other.input("x", bz.Shape(("n", 4)))
    w = other.param("w", bz.Shape((4,)))
    vals = other.add_node(ElementwiseRegion(changed), (x, w), name="region", provenance="fuse")
    other.set_outputs(list(vals))
    other.nodes[0] = dataclasses.replace(other.nodes[0], provenance=back.nodes[0].provenance)
    other.nodes[1] = dataclasses.replace(other.nodes[1], provenance=back.nodes[1].provenance)
    assert other != back
    assert "body differs" in graph_diff(back, other)


# -- one small graph per op kind (braze.op_examples) --------------------------------------------
def test_every_registered_op_kind_has_an_example():
    missing = sorted(set(OP_REGISTRY) - set(OP_EXAMPLES))
    assert not missing, f"add an example to OP_EXAMPLES in braze/op_examples.py for: {missing}"


@pytest.mark.parametrize("kind", sorted(OP_EXAMPLES))
def test_each_op_kind_round_trips(kind):
    g = example_graph(kind)
    assert any(n.op.kind == kind for n in g.nodes)
    bz.verify(g)
    round_trip(g)


# -- errors -------------------------------------------------------------------------------------
GOOD = """graph g(%x: f32[2, 3]) params(%w: f32[3, 4]) {
  %x = input
  %w = param
  %2 = matmul(%x, %w) -> f32[2, 4]   # m.py:1
  %3 = gelu(%2) -> f32[2, 4]
  return %3
}"""


def test_hand_written_text_parses():
    g = bz.Graph.parse(GOOD)
    assert [n.op.label for n in g.nodes] == ["input", "param", "matmul", "gelu"]
    assert g.node(2).provenance == "m.py:1" and g.outputs == [bz.Value(3)]


@pytest.mark.parametrize("old, new, line, message", [
    ("gelu(%2)", "gelux(%2)", 5, "unknown op 'gelux'"),
    ("gelu(%2)", "gelu(%9)", 5, "%9 is not defined before this line"),
    ("-> f32[2, 4]   #", "-> f32[2, 5]   #", 4, "infers f32[2, 4]"),
    ("matmul(%x, %w)", "matmul[alpha=1](%x, %w)", 4, "unknown attribute 'alpha'"),
    ("gelu(%2)", "leaky_relu[alpha=true](%2)", 5, "attribute 'alpha'"),
    ("  return %3\n", "", 6, "no `return` line"),
    ("%w = param", "%w = param $", 3, "unexpected character '$'"),
    ("(%x: f32[2, 3])", "(%x: f32[2, 3], %y: f32[2])", 1, "declared in the header but never"),
    ("params(%w: f32[3, 4])", "params(%w: f32[3, 4)", 1, "expected ']'"),
    ("%3 = gelu", "%2 = gelu", 5, "defined twice"),
])
def test_parse_errors_name_the_line_and_give_a_hint(old, new, line, message):
    bad = GOOD.replace(old, new)
    assert bad != GOOD
    with pytest.raises(bz.ParseError) as e:
        bz.Graph.parse(bad)
    text = str(e.value)
    assert f"line {line}," in text and message in text


def test_parse_error_for_out_of_order_values_hints_at_topological_order():
    bad = GOOD.replace("  %2 = matmul(%x, %w) -> f32[2, 4]   # m.py:1\n", "").replace(
        "  return", "  %2 = matmul(%x, %w) -> f32[2, 4]\n  return")
    with pytest.raises(bz.ParseError, match="topological order"):
        bz.Graph.parse(bad)


@settings(max_examples=30, deadline=None)
@given(random_graphs(max_nodes=12))
def test_random_graphs_round_trip_through_text(g):
    round_trip(g)


@pytest.mark.parametrize("name", ["#c", "#0", "#1", "日本", "ü", "a·b"])
def test_odd_source_and_node_names_round_trip(name):
    """A name starting with '#' is not a node id (the parser's id keys were "#<id>"), and a
    non-ASCII identifier is printed quoted (the tokenizer reads ASCII names bare)."""
    g = bz.Graph(name)
    x = g.input(name, bz.Shape((2,), bz.f32))
    y = g.exp(x)
    z = g.add_node(g.node(y).op, (y,), name=name + "_n")[0]
    g.set_outputs([z])
    round_trip(g)


def test_node_named_like_an_id_keeps_its_name():
    g = bz.Graph("g")
    x = g.input("x", bz.Shape((2,), bz.f32))
    y = g.exp(x)
    z = g.add_node(g.node(y).op, (x,), name="#0")[0]
    g.set_outputs([g.add(y, z)])
    assert round_trip(g).node(z).name == "#0"


@pytest.mark.parametrize("sym", ["ü", "日", "seq_日本"])
def test_non_ascii_symbolic_dims_round_trip(sym):
    g = bz.Graph("g")
    x = g.input("x", bz.Shape((sym, 2), bz.f32))
    g.set_outputs([g.exp(x)])
    round_trip(g)


def test_a_dim_past_int64_is_a_parse_error_naming_it():
    """A dim no array can have (past 2**62) is refused where the graph is read, not later by
    NumPy (random_feeds had raised 'Maximum allowed dimension exceeded')."""
    text = "graph g(x: f32[99999999999999999999999999]) {\n  return %x\n}\n"
    with pytest.raises(bz.BrazeError, match="99999999999999999999999999"):
        bz.Graph.parse(text)
    with pytest.raises(bz.ShapeError, match="larger than any array"):
        bz.Shape((2**63,))


@pytest.mark.parametrize("old, new", [
    ("f32[4, 3]", f"f32[{'9' * 5000}, 3]"),              # a dim
    ("add(%3, %b)", f"add(%3.{'9' * 5000}, %b)"),        # an output index
    ("add(%3, %b)", f"add(%{'9' * 5000}, %b)"),          # a node id
    ("relu(%4)", f"leaky_relu[alpha={'9' * 5000}](%4)"),  # an attribute
    ("relu(%4)", "reshape[shape=" + "(" * 5000 + ")" * 5000 + "](%4)"),
])
def test_hostile_text_is_a_parse_error(old, new):
    """Found by a hostile-file sweep: an int of more than 4300 digits was a ValueError from
    int(), nesting 5000 deep a RecursionError, and bytes a TypeError."""
    text = ("graph g(%x: f32[2, 4]) params(%w: f32[4, 3], %b: f32[3]) {\n  %w = param\n"
            "  %b = param\n  %x = input\n  %3 = matmul(%x, %w) -> f32[2, 3]\n"
            "  %4 = add(%3, %b) -> f32[2, 3]\n  %5 = relu(%4) -> f32[2, 3]\n  return %5\n}")
    round_trip(bz.Graph.parse(text))
    with pytest.raises(bz.ParseError):
        bz.Graph.parse(text.replace(old, new))
    with pytest.raises(bz.ParseError, match="must be a str, got bytes"):
        bz.Graph.parse(text.encode())


def test_a_large_constant_parses_in_memory_proportional_to_its_text():
    """The string token repeated a group per character, and Python's regex engine keeps ~100
    bytes of state per repeat: 5 MB of text took 1.3 GB, and a graph holding a 100 MB constant
    could not be parsed back."""
    import tracemalloc

    g = bz.Graph("big")
    x = g.input("x", bz.Shape((100_000,)))
    data = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
    g.set_outputs([g.add(x, g.constant(data))])
    text = str(g)
    tracemalloc.start()
    try:
        back = bz.Graph.parse(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 * len(text), (peak, len(text))
    np.testing.assert_array_equal(back.nodes[1].op.value, data)
