"""softmax_cross_entropy and its backward: the ops (both label forms, every reduction) agree
with PyTorch and with finite differences, and stay finite on huge logits; LowerSoftmaxCrossEntropy
turns them into log_softmax / softmax, a one-hot (arange + eq + cast), mul and reductions with
the interpreter's numbers; a backend without a loss kernel gets them through rewrite_for_backend."""
from collections import Counter

import numpy as np
import pytest
from lowering_helpers import op_counts

import braze as bz
from braze.passes.targets import all_op_names
from braze.testing import assert_equivalent

LOSS_KINDS = {"softmax_cross_entropy", "softmax_cross_entropy_backward"}


def _loss_graph(rows=("b", 3), classes=5, soft=False, reduction="mean", backward=False):
    g = bz.Graph("ce")
    logits = g.input("logits", bz.Shape(rows + (classes,)))
    if soft:
        labels = g.softmax(g.input("t", bz.Shape(rows + (classes,))))
    else:
        labels = g.input("labels", bz.Shape(rows, bz.i64))
    if backward:
        loss_dims = rows if reduction == "none" else ()
        d_loss = g.input("d_loss", bz.Shape(loss_dims))
        g.set_outputs([g.softmax_cross_entropy_backward(logits, labels, d_loss, reduction)])
    else:
        g.set_outputs([g.softmax_cross_entropy(logits, labels, reduction)])
    return g


COMBOS = [(soft, red, bwd) for soft in (False, True) for red in ("mean", "sum", "none")
          for bwd in (False, True)]


def _id(c):
    return f"{'probs' if c[0] else 'index'}-{c[1]}-{'backward' if c[2] else 'loss'}"


@pytest.mark.parametrize("combo", COMBOS, ids=_id)
def test_lowering_matches_the_reference_with_symbolic_rows(combo):
    soft, red, bwd = combo
    g = _loss_graph(soft=soft, reduction=red, backward=bwd)
    res = bz.LowerSoftmaxCrossEntropy.run(g)
    assert res.changed
    kinds = op_counts(res.graph)
    assert not LOSS_KINDS & set(kinds)
    assert (kinds["softmax"], kinds["log_softmax"]) == (bwd + soft, 1 - bwd)  # soft: t's own
    one_hot = 0 if soft else 1
    row_count = 1 if bwd and red == "mean" else 0  # 1 / rows of the symbolic batch, as a cast
    assert (kinds["eq"], kinds["cast"]) == (one_hot, one_hot + row_count)
    assert_equivalent(g, res.graph, symbols={"b": 4}, seeds=(0, 1, 2))


def test_index_loss_lowers_to_one_hot_mul_and_reductions():
    res = bz.LowerSoftmaxCrossEntropy.run(_loss_graph(rows=(6,), classes=4))
    assert op_counts(res.graph) == Counter({"range": 1, "reshape": 2, "eq": 1, "cast": 1,
                                          "log_softmax": 1, "mul": 1, "reduce_sum": 1,
                                          "neg": 1, "reduce_mean": 1})


@pytest.mark.parametrize("soft", [False, True], ids=["index", "probs"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_loss_matches_pytorch(soft, reduction):
    torch = pytest.importorskip("torch")
    g = _loss_graph(rows=(4, 3), classes=6, soft=soft, reduction=reduction)
    feeds = bz.random_feeds(g, 7)
    (got,) = bz.interpret(g, feeds)
    (low,) = bz.interpret(bz.LowerSoftmaxCrossEntropy(g), feeds)
    logits = torch.from_numpy(feeds["logits"]).permute(0, 2, 1)  # torch wants classes at dim 1
    if soft:
        target = torch.softmax(torch.from_numpy(feeds["t"]), -1).permute(0, 2, 1)
    else:
        target = torch.from_numpy(feeds["labels"])
    want = torch.nn.functional.cross_entropy(logits, target, reduction=reduction).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(low, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("soft", [False, True], ids=["index", "probs"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_backward_is_the_gradient_of_the_loss(soft, reduction):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((3, 5))
    labels = (rng.dirichlet(np.ones(5), 3) if soft else rng.integers(0, 5, 3))
    d_loss = rng.standard_normal(() if reduction != "none" else (3,))
    g = bz.Graph("grad")
    x = g.input("logits", bz.Shape((3, 5), bz.f64))
    t = g.input("labels", bz.Shape(labels.shape, bz.f64 if soft else bz.i64))
    dl = g.input("d_loss", bz.Shape(d_loss.shape, bz.f64))
    g.set_outputs([g.softmax_cross_entropy(x, t, reduction),
                   g.softmax_cross_entropy_backward(x, t, dl, reduction)])
    low = bz.LowerSoftmaxCrossEntropy(g)
    feeds = {"logits": logits, "labels": labels, "d_loss": d_loss}

    def weighted_loss(z):
        return float(np.sum(bz.interpret(g, {**feeds, "logits": z})[0] * d_loss))

    eps, numeric = 1e-6, np.zeros_like(logits)
    for i in np.ndindex(logits.shape):
        step = np.zeros_like(logits)
        step[i] = eps
        numeric[i] = (weighted_loss(logits + step) - weighted_loss(logits - step)) / (2 * eps)
    for graph in (g, low):
        np.testing.assert_allclose(bz.interpret(graph, feeds)[1], numeric, rtol=1e-6,
                                   atol=1e-8)


def test_huge_logits_stay_finite_and_shift_invariant():
    g = _loss_graph(rows=(2,), classes=4, backward=False, reduction="none")
    low = bz.LowerSoftmaxCrossEntropy(g)
    logits = np.array([[1e4, -1e4, 0, 3e4], [50.0, 51, 52, 53]], np.float32)
    labels = np.array([1, 3], np.int64)
    for graph in (g, low):
        (big,) = bz.interpret(graph, {"logits": logits, "labels": labels})
        (shifted,) = bz.interpret(graph, {"logits": logits - logits.max(-1, keepdims=True),
                                          "labels": labels})
        assert np.isfinite(big).all()
        np.testing.assert_allclose(big, shifted, rtol=1e-6)
        np.testing.assert_allclose(big[0], 4e4, rtol=1e-6)


def test_graph_without_loss_ops_is_unchanged():
    g = bz.Graph("plain")
    x = g.input("x", bz.Shape((2, 5)))
    g.set_outputs([g.log_softmax(x)])
    res = bz.LowerSoftmaxCrossEntropy.run(g)
    assert not res.changed and res.graph is g


def test_input_graph_is_not_mutated():
    g = _loss_graph(backward=True)
    before = str(g)
    bz.LowerSoftmaxCrossEntropy(g)
    assert str(g) == before


@pytest.mark.parametrize("labels, match", [
    (bz.Shape((4, 5), bz.i64), "without the class axis"),
    (bz.Shape((4, 3)), "shaped and typed like the logits"),
    (bz.Shape((4,), bz.f32), "shaped and typed like the logits"),
])
def test_mismatched_labels_are_a_shape_error_naming_the_op(labels, match):
    g = bz.Graph("bad")
    x = g.input("x", bz.Shape((4, 5)))
    with pytest.raises(bz.ShapeError, match=match):
        g.softmax_cross_entropy(x, g.input("t", labels))


def test_unknown_reduction_and_out_of_range_labels_are_clear_errors():
    g = bz.Graph("bad")
    x, t = g.input("x", bz.Shape((2, 3))), g.input("t", bz.Shape((2,), bz.i64))
    with pytest.raises(bz.GraphError, match="known: mean, sum, none"):
        g.softmax_cross_entropy(x, t, "average")
    g.set_outputs([g.softmax_cross_entropy(x, t)])
    with pytest.raises(bz.BrazeError, match=r"class labels must lie in \[0, 3\)"):
        bz.interpret(g, {"x": np.zeros((2, 3), np.float32), "t": np.array([0, 3])})


def test_backend_without_a_loss_kernel_gets_it_through_rewrite_for_backend():
    g = bz.Graph("train_step")
    logits = g.input("logits", bz.Shape(("b", 4)))
    labels = g.input("labels", bz.Shape(("b",), bz.i64))
    loss = g.softmax_cross_entropy(logits, labels)
    g.set_outputs([loss, g.softmax_cross_entropy_backward(logits, labels, g.exp(loss))])
    target = bz.get_target("cpu").restrict(all_op_names() - LOSS_KINDS, name="no_loss_kernel")
    trace = Counter()
    low = bz.rewrite_for_backend(g, target, trace=trace)
    assert trace == Counter({"LowerSoftmaxCrossEntropy": 2})
    assert bz.legalize(low, target) is low
    assert_equivalent(g, low, symbols={"b": 5})
