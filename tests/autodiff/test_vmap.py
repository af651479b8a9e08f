"""vmap: every op kind's example graph, a table of partly batched ops, an MLP, a GPT-2 block and
per-example gradients, each against a Python loop that interprets the graph one example at a
time and stacks the results."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.autodiff import grad_with_loss, vmap
from braze.errors import AutodiffError
from braze.models.gpt2 import gpt2_blocks
from braze.op_examples import OP_EXAMPLES, example_graph

N = 3  # examples per batch


def looped(g: bz.Graph, feeds: dict, batched: set[str], params=None) -> list[np.ndarray]:
    """g's outputs per example (interpreting g once per example), stacked on axis 0."""
    per = [bz.interpret(g, {k: (v[i] if k in batched else v) for k, v in feeds.items()}, params)
           for i in range(N)]
    return [np.stack([p[j] for p in per]) for j in range(len(g.outputs))]


def check_vmap(g: bz.Graph, feeds: dict, in_axes=None, params=None, **kw) -> bz.Graph:
    """vmap(g) on the batched feeds equals the loop; returns the vmapped graph."""
    batched = {n.op.name for n in g.inputs} if in_axes is None else set(in_axes)
    vg = vmap(g, in_axes, **kw)
    bz.verify(vg)
    got = bz.interpret(vg, feeds, params)
    want = looped(g, feeds, batched, params)
    assert len(got) == len(want)
    for a, w in zip(got, want):
        assert a.shape == w.shape
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5)
    return vg


def _feeds(g: bz.Graph, batched, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for n in g.inputs:
        dims = tuple(n.op.shape.dims)
        lead = (N,) if batched is None or n.op.name in batched else ()
        x = rng.normal(size=lead + dims)
        out[n.op.name] = x.astype(n.op.shape.dtype.np) if n.op.shape.dtype.is_float else (
            np.abs(x * 3).astype(n.op.shape.dtype.np) % 2)
    return out


@pytest.mark.parametrize("kind", sorted(OP_EXAMPLES))
def test_every_op_example_vmaps_like_a_loop(kind):
    g = example_graph(kind)
    params = bz.init_params(g, seed=1)
    feeds = _feeds(g, None, seed=2)
    if kind == "isnan":
        feeds["x"] = np.abs(feeds["x"]) + 0.5
    check_vmap(g, feeds, params=params)


def _graph(fn, *shapes, dtypes=None):
    g = bz.Graph("f")
    xs = [g.input(f"x{i}", bz.Shape(s, (dtypes or {}).get(i, bz.f32)))
          for i, s in enumerate(shapes)]
    out = fn(g, *xs)
    g.set_outputs(list(out) if isinstance(out, tuple) else [out])
    return g


# (name, builder, input shapes, which inputs are batched, dtypes)
PARTIAL = [
    ("add_rhs_batched", lambda g, a, b: g.add(a, b), [(4, 5), (5,)], ["x1"]),
    ("add_lower_rank_batched", lambda g, a, b: g.mul(a, b), [(2, 4, 5), (5,)], ["x1", "x0"]),
    ("where_cond_batched", lambda g, a, b: g.where(g.lt(a, 0.0), a, b), [(4, 5), (4, 5)],
     ["x0"]),
    ("matmul_lhs", lambda g, a, b: g.mm(a, b), [(2, 3, 4), (4, 5)], ["x0"]),
    ("matmul_rhs", lambda g, a, b: g.mm(a, b), [(3, 4), (2, 4, 5)], ["x1"]),
    ("matmul_lhs_fewer_dims", lambda g, a, b: g.mm(a, b), [(3, 4), (2, 4, 5)], ["x0"]),
    ("matmul_both", lambda g, a, b: g.mm(a, b), [(2, 3, 4), (4, 5)], ["x0", "x1"]),
    ("matmul_vec_lhs", lambda g, a, b: g.mm(a, b), [(4,), (2, 4, 5)], ["x0"]),
    ("matmul_vec_rhs", lambda g, a, b: g.mm(a, b), [(3, 4), (4,)], ["x1"]),
    ("matmul_vec_vec", lambda g, a, b: g.mm(a, b), [(4,), (4,)], ["x0"]),
    ("dot_general_lhs", lambda g, a, b: g.dot_general(a, b, (2,), (1,), (0,), (0,)),
     [(2, 3, 4), (2, 4, 5)], ["x0"]),
    ("dot_general_rhs", lambda g, a, b: g.dot_general(a, b, (2,), (1,), (0,), (0,)),
     [(2, 3, 4), (2, 4, 5)], ["x1"]),
    ("dot_general_both", lambda g, a, b: g.dot_general(a, b, (1,), (0,)), [(3, 4), (4, 5)],
     ["x0", "x1"]),
    ("concat_one_batched", lambda g, a, b: g.concat([a, b], 1), [(2, 3), (2, 4)], ["x1"]),
    ("layer_norm_batched_gamma", lambda g, a, b: g.layer_norm(a, b), [(3, 8), (8,)],
     ["x0", "x1"]),
    ("layer_norm_shared_gamma", lambda g, a, b: g.layer_norm(a, b), [(3, 8), (8,)], ["x0"]),
    ("attention_q_batched", lambda g, q, k: g.attention(q, k, k, kind="causal"),
     [(2, 2, 3, 4), (2, 2, 3, 4)], ["x0"]),
    ("softmax_then_sum", lambda g, a: g.sum(g.softmax(a, 0), (1,)), [(4, 5)], ["x0"]),
    ("transpose_reshape", lambda g, a: g.reshape(g.transpose(a, (1, 0, 2)), (3, -1)),
     [(2, 3, 4)], ["x0"]),
    ("conv_input_batched", lambda g, a, w: g.conv2d(a, w, padding=(1, 1, 1, 1)),
     [(2, 3, 4, 4), (5, 3, 3, 3)], ["x0"]),
]


@pytest.mark.parametrize("name,fn,shapes,in_axes", PARTIAL, ids=[r[0] for r in PARTIAL])
def test_partly_batched_ops_vmap_like_a_loop(name, fn, shapes, in_axes):
    g = _graph(fn, *shapes)
    check_vmap(g, _feeds(g, in_axes), in_axes)


def test_gather_with_batched_indices_moves_the_batch_axis_in_front():
    g = bz.Graph("emb")
    table = g.input("table", bz.Shape((7, 4)))
    ids = g.input("ids", bz.Shape((3,), bz.i64))
    g.set_outputs([g.gather(table, ids, 0)])
    rng = np.random.default_rng(0)
    feeds = {"table": rng.normal(size=(7, 4)).astype(np.float32),
             "ids": rng.integers(0, 7, size=(N, 3))}
    check_vmap(g, feeds, ["ids"])


def test_mlp_vmaps_with_shared_params():
    g = bz.Graph("mlp")
    x = g.input("x", bz.Shape((5,)))
    h = g.gelu(g.add(g.mm(x, g.param("w1", bz.Shape((5, 8)))), g.param("b1", bz.Shape((8,)))))
    g.set_outputs([g.mm(h, g.param("w2", bz.Shape((8, 2))))])
    params = bz.init_params(g, seed=0)
    vg = check_vmap(g, _feeds(g, None), params=params)
    assert vg.shape_of(vg.outputs[0]).dims == ("vmap_batch", 2)
    assert {n.op.name for n in vg.params} == {"w1", "b1", "w2"}
    assert vg.count("matmul") == 2


def test_gpt2_block_vmaps_and_keeps_its_attention_and_norms():
    g = gpt2_blocks(layers=1, hidden=16, heads=2, batch=2, seq=4)
    params = bz.init_params(g, seed=0)
    vg = check_vmap(g, _feeds(g, None), params=params)
    assert vg.count("attention") == g.count("attention") == 1
    assert vg.count("layer_norm") == g.count("layer_norm")


def test_static_batch_size_and_in_axes_subset():
    g = _graph(lambda g, a, b: g.add(g.mm(a, b), 1.0), (3, 4), (4, 2))
    vg = check_vmap(g, _feeds(g, ["x1"]), ["x1"], axis_name=N)
    assert vg.shape_of(vg.input_value("x0")).dims == (3, 4)
    assert vg.shape_of(vg.outputs[0]).dims == (N, 3, 2)


def test_in_axes_as_a_mapping_batches_the_zeros_and_refuses_other_axes():
    """{"x1": 1} batched x1 on a new axis 0 (the dict's keys were taken as names), silently
    ignoring the 1; only 0 (batched) and None (shared) are meaningful."""
    g = _graph(lambda g, a, b: g.add(g.mm(a, b), 1.0), (3, 4), (4, 2))
    feeds = _feeds(g, ["x1"])
    vg = vmap(g, {"x0": None, "x1": 0})
    assert vg.shape_of(vg.input_value("x0")).dims == (3, 4)
    np.testing.assert_array_equal(bz.interpret(vg, feeds)[0],
                                  bz.interpret(check_vmap(g, feeds, ["x1"]), feeds)[0])
    with pytest.raises(AutodiffError, match=r"in_axes\['x1'\] = 1.*leading axis"):
        vmap(g, {"x1": 1})


def test_outputs_that_ignore_the_batched_inputs_are_broadcast():
    g = _graph(lambda g, a, b: (g.exp(a), g.neg(b)), (2, 3), (4,))
    vg = check_vmap(g, _feeds(g, ["x0"]), ["x0"])
    assert vg.shape_of(vg.outputs[1]).dims == ("vmap_batch", 4)


def test_per_example_gradients_through_vmap_of_grad_with_loss():
    g = bz.Graph("reg")
    x = g.input("x", bz.Shape((6,), bz.f64))
    y = g.input("y", bz.Shape((2,), bz.f64))
    w = g.param("w", bz.Shape((6, 2), bz.f64))
    pred = g.tanh(g.mm(x, w))
    g.set_outputs([g.mean(g.square(g.sub(pred, y)))])
    gg = grad_with_loss(g, ["w"])
    params = bz.init_params(g, seed=3)
    vg = check_vmap(gg, _feeds(gg, None, seed=4), params=params)
    assert vg.shape_of(vg.outputs[1]).dims == ("vmap_batch", 6, 2)
    # the per-example gradients average to the gradient of the mean loss over the batch
    feeds = _feeds(gg, None, seed=4)
    per = bz.interpret(vg, feeds, params)[1]
    bg = bz.Graph("batch_loss")
    bx = bg.input("x", bz.Shape((N, 6), bz.f64))
    by = bg.input("y", bz.Shape((N, 2), bz.f64))
    bw = bg.param("w", bz.Shape((6, 2), bz.f64))
    err = bg.sub(bg.tanh(bg.mm(bx, bw)), by)
    bg.set_outputs([bg.mean(bg.mean(bg.square(err), (1,)))])
    full = bz.interpret(grad_with_loss(bg, ["w"]), feeds, params)[1]
    np.testing.assert_allclose(per.mean(0), full, rtol=1e-10)


def test_errors_name_the_problem():
    g = _graph(lambda g, a: g.exp(a), (2,))
    with pytest.raises(AutodiffError, match="no input named 'nope'"):
        vmap(g, ["nope"])
    sym = bz.Graph("sym")
    sym.set_outputs([sym.exp(sym.input("x", bz.Shape(("vmap_batch", 2))))])
    with pytest.raises(AutodiffError, match="already uses the dim symbol 'vmap_batch'"):
        vmap(sym)
    vmap(sym, axis_name="examples")
    gather = bz.Graph("both")
    t = gather.input("t", bz.Shape((5, 2)))
    i = gather.input("i", bz.Shape((3,), bz.i64))
    gather.set_outputs([gather.gather(t, i, 0)])
    with pytest.raises(AutodiffError, match=r"%2 \(gather\).*both batched"):
        vmap(gather)


def test_vmapped_graph_prints_parses_and_fuses():
    g = _graph(lambda g, a, b: g.gelu(g.add(g.mm(a, b), 1.0)), (3, 4), (4, 2))
    vg = vmap(g, ["x0"])
    assert bz.Graph.parse(str(vg)) == vg
    fused, _ = bz.fuse(vg, target="cpu")
    feeds = _feeds(g, ["x0"])
    np.testing.assert_allclose(bz.interpret(fused, feeds)[0], bz.interpret(vg, feeds)[0],
                               rtol=1e-5, atol=1e-6)


def _step_body():
    body = bz.Graph("step")
    c = body.input("in0", bz.Shape((3,)))
    w = body.input("in1", bz.Shape((3, 3)))
    x = body.input("in2", bz.Shape((3,)))
    new = body.tanh(body.add(body.mm(c, w), x))
    body.set_outputs([new, body.sum(new)])
    return body


@pytest.mark.parametrize("in_axes", [["c"], ["xs"], ["w"], ["c", "w", "xs"]])
def test_scan_vmaps_its_body_and_stays_one_scan(in_axes):
    g = bz.Graph("scan")
    c = g.input("c", bz.Shape((3,)))
    w = g.input("w", bz.Shape((3, 3)))
    xs = g.input("xs", bz.Shape((4, 3)))
    g.set_outputs(list(g.scan_general(_step_body(), c, 4, bcasts=[w], xs=[xs], reverse=True)))
    vg = check_vmap(g, _feeds(g, in_axes), in_axes)
    assert vg.count("scan") == 1
    assert vg.shape_of(vg.outputs[1]).dims == ("vmap_batch", 4)
