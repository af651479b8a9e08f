"""Layout canonicalization: transpose/reshape chains, reshape-transpose-reshape sandwiches and
linear layers on flattened rows take one canonical form; interiors read elsewhere stay."""
import numpy as np
from helpers import check_same, run_rules

import braze as bz
from braze.passes.canonicalize.layout import LAYOUT_RULES, merge_groups
from braze.rewrite import rewrite


def test_transpose_chains_compose_and_identities_vanish():
    g = bz.Graph("t")
    x = g.input("x", bz.Shape(("b", 3, 4, 5)))
    y = g.transpose(g.transpose(x, (0, 2, 1, 3)), (0, 1, 3, 2))
    z = g.transpose(g.transpose(x, (0, 2, 1, 3)), (0, 2, 1, 3))     # the identity
    g.set_outputs([y, g.reshape(g.reshape(z, ("b", 12, 5)), ("b", 3, 4, 5))])
    out, _ = run_rules(g, *LAYOUT_RULES)
    counts = out.op_counts()
    assert counts.get("transpose") == 1 and "reshape" not in counts
    (t,) = [n for n in out.nodes if n.op.kind == "transpose"]
    assert t.op.perm == (0, 2, 3, 1)
    check_same(g, out)


def test_reshape_transpose_reshape_collapses_to_one_transpose():
    """dynamo's key transpose: [b, 4, s, 16] -> [4b, s, 16] -> (0, 2, 1) -> [b, 4, 16, s]."""
    g = bz.Graph("k")
    x = g.input("x", bz.Shape(("b", 4, "s", 16)))
    y = g.reshape(g.transpose(g.reshape(x, ("4*b", "s", 16)), (0, 2, 1)), ("b", 4, 16, "s"))
    g.set_outputs([y])
    out, _ = run_rules(g, *LAYOUT_RULES)
    assert out.op_counts() == {"transpose": 1}
    assert [n.op.perm for n in out.nodes if n.op.kind == "transpose"] == [(0, 1, 3, 2)]
    check_same(g, out, symbols={"b": 2, "s": 3})


def test_sandwich_that_does_not_split_back_moves_the_transpose_before_the_merge():
    g = bz.Graph("k")
    x = g.input("x", bz.Shape((2, 4, 3, 6)))
    y = g.reshape(g.transpose(g.reshape(x, (8, 3, 6)), (0, 2, 1)), (8, 18))  # stays merged
    g.set_outputs([y])
    out, _ = run_rules(g, *LAYOUT_RULES)
    assert out.count("transpose") == 1 and out.count("reshape") == 1
    (t,) = [n for n in out.nodes if n.op.kind == "transpose"]
    assert t.op.perm == (0, 1, 3, 2) and t.inputs[0].node == out.input_ids[0]
    check_same(g, out)


def test_transpose_of_a_merged_view_moves_onto_the_head_axes():
    """repeat_kv and key transposes written on a [B*H, S, D] view (dynamo's sdpa export)."""
    g = bz.Graph("kv")
    k = g.input("k", bz.Shape(("b", 2, 2, "s", 4)))
    kt = g.transpose(g.reshape(k, ("4*b", "s", 4)), (0, 2, 1))
    y = g.transpose(g.reshape(kt, ("b", 4, 4, "s")), (0, 1, 3, 2))
    g.set_outputs([y])
    out, _ = run_rules(g, *LAYOUT_RULES)
    assert out.count("transpose") == 0 and out.count("reshape") == 1
    check_same(g, out, symbols={"b": 2, "s": 3})
    assert merge_groups((2, 3), (3, 2)) is None


def _flat_linear(g, x, w, b, shared=False):
    flat = g.reshape(x, ("b*s", 8))
    y = g.add(g.matmul(flat, w), b)
    return g.reshape(y, ("b", "s", 6)), flat


def test_linear_on_flattened_rows_unflattens():
    g = bz.Graph("lin")
    x = g.input("x", bz.Shape(("b", "s", 8)))
    w, b = g.param("w", bz.Shape((8, 6))), g.param("bias", bz.Shape((6,)))
    y, _ = _flat_linear(g, x, w, b)
    g.set_outputs([y])
    out, _ = run_rules(g, *LAYOUT_RULES)
    assert out.op_counts() == {"matmul": 1, "add": 1}
    mm = next(n for n in out.nodes if n.op.kind == "matmul")
    assert out.shape_of(mm.value).dims == ("b", "s", 6)
    check_same(g, out)


def test_unflattened_linear_removes_what_only_it_read_at_once():
    """The flattening reshape, the matmul and the bias add go with the match (nothing dead is
    left for the passes before the next DCE to carry)."""
    g = bz.Graph("lin")
    x = g.input("x", bz.Shape(("b", "s", 8)))
    w, b = g.param("w", bz.Shape((8, 6))), g.param("bias", bz.Shape((6,)))
    y, _ = _flat_linear(g, x, w, b)
    g.set_outputs([y, g.reshape(g.matmul(g.reshape(x, ("b*s", 8)), w), ("b", "s", 6))])
    res = rewrite(g, LAYOUT_RULES)
    assert res.stats["UnflattenLinear"].matches == 2
    assert res.graph.op_counts() == {"matmul": 2, "add": 1}
    check_same(g, res.graph)


def test_flattened_linear_whose_rows_are_used_elsewhere_stays():
    g = bz.Graph("lin")
    x = g.input("x", bz.Shape(("b", "s", 8)))
    w, b = g.param("w", bz.Shape((8, 6))), g.param("bias", bz.Shape((6,)))
    y, flat = _flat_linear(g, x, w, b)
    g.set_outputs([y, flat])                      # the flattened rows are an output too
    out, _ = run_rules(g, *LAYOUT_RULES)
    assert out.count("reshape") == 2
    check_same(g, out)


def test_a_reshape_that_reads_another_reshape_keeps_that_ones_other_users():
    g = bz.Graph("two")
    x = g.input("x", bz.Shape((2, 12)))
    mid = g.reshape(x, (2, 3, 4))
    g.set_outputs([g.reshape(mid, (6, 4)), g.exp(mid)])
    out, _ = run_rules(g, *LAYOUT_RULES)
    assert out.count("reshape") == 2 and out.count("exp") == 1
    a = np.arange(24, dtype=np.float32).reshape(2, 12)
    np.testing.assert_array_equal(bz.interpret(out, {"x": a})[0], a.reshape(6, 4))


def test_split_pieces_become_narrows_even_when_returned():
    """aten.split / ONNX Split: each piece is a narrow of the input (the form fusions read);
    a piece the graph returns is still returned, with its shape."""
    g = bz.Graph("split")
    x = g.input("x", bz.Shape(("b", "s", 12)))
    a, b, c = g.split(g.exp(x), -1, [2, 4, 6])
    g.set_outputs([g.add(a, g.narrow(b, 2, 0, 2)), c])
    out, _ = run_rules(g, *LAYOUT_RULES)
    counts = out.op_counts()
    assert "split" not in counts and counts["narrow"] == 3 + 1
    starts = sorted((n.op.axis, n.op.start, n.op.length) for n in out.nodes
                    if n.op.kind == "narrow" and out.nodes[n.inputs[0].node].op.kind == "unary")
    assert starts == [(2, 0, 2), (2, 2, 4), (2, 6, 6)]
    assert [out.shape_of(v).dims for v in out.outputs] == [("b", "s", 2), ("b", "s", 6)]
    check_same(g, out, symbols={"b": 2, "s": 3})


# -- transposes folded into the sandwich rules ---------------------------------------------------
def _matches(g):
    return {k: s.matches for k, s in rewrite(g, LAYOUT_RULES).stats.items() if s.matches}


def test_key_transpose_sandwich_folds_the_head_transpose_above_it():
    """dynamo's BERT key: view, transpose(1, 2), then a sandwich on [B*H, S, D]: one match
    leaves one transpose of the view (no ComposeTransposes sweep; the interiors, read only
    by the match, go with it, so TransposeBeforeMerge never sees them)."""
    g = bz.Graph("key")
    x = g.input("x", bz.Shape(("b", "s", 16)))
    k = g.transpose(g.reshape(x, ("b", "s", 4, 4)), (0, 2, 1, 3))
    y = g.reshape(g.transpose(g.reshape(k, ("4*b", "s", 4)), (0, 2, 1)), ("b", 4, 4, "s"))
    g.set_outputs([y])
    assert _matches(g) == {"CollapseReshapeTranspose": 1}
    out, misses = run_rules(g, *LAYOUT_RULES)
    assert out.op_counts() == {"reshape": 1, "transpose": 1} and not misses
    (t,) = [n for n in out.nodes if n.op.kind == "transpose"]
    assert t.op.perm == (0, 2, 3, 1) and out.nodes[t.inputs[0].node].op.kind == "reshape"
    check_same(g, out, symbols={"b": 2, "s": 3})


def test_transpose_before_merge_folds_the_transpose_above_it():
    g = bz.Graph("kv")
    x = g.input("x", bz.Shape(("b", 4, "s", 8)))
    v = g.transpose(x, (0, 2, 1, 3))                                   # [b, s, 4, 8]
    y = g.transpose(g.reshape(v, ("b", "s", 32)), (1, 0, 2))           # [s, b, 32]
    g.set_outputs([y])
    assert _matches(g) == {"TransposeBeforeMerge": 1}
    out, _ = run_rules(g, *LAYOUT_RULES)
    assert out.op_counts() == {"transpose": 1, "reshape": 1}
    (t,) = [n for n in out.nodes if n.op.kind == "transpose"]
    assert t.op.perm == (2, 0, 1, 3) and t.inputs[0].node == out.input_ids[0]
    check_same(g, out, symbols={"b": 2, "s": 3})


def test_a_fold_that_composes_to_the_identity_leaves_x():
    g = bz.Graph("id")
    x = g.input("x", bz.Shape(("b", 4, "s", 8, 2)))
    y = g.transpose(x, (0, 2, 1, 3, 4))                                 # [b, s, 4, 8, 2]
    z = g.transpose(g.reshape(y, ("b", "s", 4, 16)), (0, 2, 1, 3))      # [b, 4, s, 16]
    g.set_outputs([g.exp(g.reshape(z, ("b", 4, "s", 8, 2)))])
    assert _matches(g) == {"CollapseReshapeTranspose": 1}
    out, _ = run_rules(g, *LAYOUT_RULES)
    assert out.op_counts() == {"exp": 1}
    check_same(g, out, symbols={"b": 2, "s": 3})


def test_folded_interiors_read_elsewhere_stay_for_their_readers():
    """The transpose above and the merge are also returned: the match still folds them (it
    reads through them) but does not remove them."""
    g = bz.Graph("kept")
    x = g.input("x", bz.Shape(("b", "s", 16)))
    k = g.transpose(g.reshape(x, ("b", "s", 4, 4)), (0, 2, 1, 3))
    merged = g.reshape(k, ("4*b", "s", 4))
    y = g.reshape(g.transpose(merged, (0, 2, 1)), ("b", 4, 4, "s"))
    g.set_outputs([y, k, merged])
    out, misses = run_rules(g, *LAYOUT_RULES)
    assert not misses
    assert sorted(n.op.perm for n in out.nodes if n.op.kind == "transpose") == \
        [(0, 2, 1, 3), (0, 2, 3, 1)]
    assert [out.shape_of(v).dims for v in out.outputs] == \
        [("b", 4, 4, "s"), ("b", 4, "s", 4), ("4*b", "s", 4)]
    check_same(g, out, symbols={"b": 2, "s": 3})


def test_a_fold_does_not_remove_what_compose_transposes_reads_in_the_same_sweep():
    """transpose(transpose(reshape(x, merge))): ComposeTransposes at the outer transpose reads
    the merge, which TransposeBeforeMerge at the inner one would consume; the driver skips it
    for that sweep (it used to lose the value and raise)."""
    g = bz.Graph("both")
    x = g.input("x", bz.Shape(("b", 4, "s", 8)))
    inner = g.transpose(g.reshape(x, ("4*b", "s", 8)), (0, 2, 1))       # [4b, 8, s]
    g.set_outputs([g.transpose(inner, (2, 0, 1))])                       # [s, 4b, 8]
    out, misses = run_rules(g, *LAYOUT_RULES)
    assert not misses and out.count("transpose") == 1 and out.count("reshape") == 1
    check_same(g, out, symbols={"b": 2, "s": 3})


def test_merge_groups_memo_answers_like_the_first_call():
    src, dst = ("batch", 4, "seq", 16), ("4*batch", "seq", 16)
    first = merge_groups(src, dst)
    assert first == [range(0, 2), range(2, 3), range(3, 4)]
    first.append(None)                                       # a caller's list is its own
    assert merge_groups(list(src), list(dst)) == [range(0, 2), range(2, 3), range(3, 4)]
    assert merge_groups((2, 3), (3, 2)) is None
