"""The layout rules' declared reach (`Rule.depth`, `Rule.reads_users`) is sound: on random
graphs of reshapes, transposes, splits, flattened rows, row-wise ops and matmuls, sweeping only
near each change gives the graph, matches and misses of sweeping every node again."""
import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import braze as bz
from braze.ir.equality import graph_diff
from braze.passes.canonicalize.attention import FOLD_REPEAT_KV
from braze.passes.canonicalize.heads import HEAD_LAYOUT_RULES
from braze.passes.canonicalize.layout import LAYOUT_RULES
from braze.rewrite import rewrite
from braze.testing import assert_equivalent

RULES = LAYOUT_RULES + HEAD_LAYOUT_RULES + (FOLD_REPEAT_KV,)


def _factor(n: int):
    return next((d for d in (2, 3) if n % d == 0 and n > d), None)


@st.composite
def layout_graphs(draw):
    """A graph from x [2, 3, 4] (or [2, 3, 2, 4]) through random layout and row-wise steps;
    some values are returned, some read twice."""
    g = bz.Graph("layout")
    dims0 = draw(st.sampled_from([(2, 3, 4), (2, 3, 2, 4), (6, 4)]))
    vals = [g.input("x", bz.Shape(dims0))]
    n_params = 0
    for _ in range(draw(st.integers(3, 14))):
        v = draw(st.sampled_from(vals))
        dims = g.shape_of(v).dims
        step = draw(st.sampled_from(["transpose", "merge", "split_axis", "unit", "flatten",
                                     "unflatten", "tanh", "add", "matmul", "split", "rope",
                                     "linear_rows", "rows", "sandwich"]))
        out = None
        if step in ("linear_rows", "rows") and len(dims) >= 3:
            # reshape(F(reshape(v, [M, E])), [L.., N]): F a linear layer or row-wise ops,
            # the flattening read twice, or made by two reshapes, at random
            flat = g.reshape(v, (int(np.prod(dims[:-1])), dims[-1]))
            if draw(st.booleans()):
                flat = g.reshape(g.reshape(v, (dims[0], -1, dims[-1])), g.shape_of(flat).dims)
            vals.append(flat)
            n_params += 1
            if step == "linear_rows":
                y = g.mm(flat, g.param(f"w{n_params}", bz.Shape((dims[-1], 4))))
            else:
                y = g.tanh(flat)
            if draw(st.booleans()):
                y = g.add(y, g.param(f"b{n_params}", bz.Shape((g.shape_of(y).dims[-1],))))
            vals.append(y)
            if draw(st.booleans()):  # a second reader of the flattened rows
                vals.append(g.reshape(flat, (dims[0], -1)))
            out = g.reshape(y, dims[:-1] + (g.shape_of(y).dims[-1],))
        elif step == "sandwich" and len(dims) >= 2:
            # reshape(transpose(reshape(v, merge), p), split back or not)
            merged = g.reshape(v, (dims[0] * dims[1],) + dims[2:])
            perm = tuple(draw(st.permutations(range(len(dims) - 1))))
            t = g.transpose(merged, perm)
            vals.append(t)
            groups = [(dims[0], dims[1])] + [(d,) for d in dims[2:]]
            back = tuple(d for a in perm for d in groups[a])
            out = g.reshape(t, back if draw(st.booleans()) else g.shape_of(t).dims[::-1])
        elif step == "transpose" and len(dims) >= 2:
            out = g.transpose(v, tuple(draw(st.permutations(range(len(dims))))))
        elif step == "merge" and len(dims) >= 2:
            i = draw(st.integers(0, len(dims) - 2))
            out = g.reshape(v, dims[:i] + (dims[i] * dims[i + 1],) + dims[i + 2:])
        elif step == "split_axis":
            i = draw(st.integers(0, len(dims) - 1))
            f = _factor(dims[i])
            if f is not None and len(dims) < 5:
                out = g.reshape(v, dims[:i] + (f, dims[i] // f) + dims[i + 1:])
        elif step == "unit" and len(dims) < 5:
            i = draw(st.integers(0, len(dims)))
            out = g.reshape(v, dims[:i] + (1,) + dims[i:])
        elif step == "flatten" and len(dims) >= 3:
            out = g.reshape(v, (int(np.prod(dims[:-1])), dims[-1]))
        elif step == "unflatten" and len(dims) == 2 and _factor(dims[0]) is not None:
            f = _factor(dims[0])
            out = g.reshape(v, (f, dims[0] // f, dims[1]))
        elif step == "tanh":
            out = g.tanh(v)
        elif step == "add":
            n_params += 1
            out = g.add(v, g.param(f"b{n_params}", bz.Shape((dims[-1],))))
        elif step == "matmul":
            n_params += 1
            out = g.mm(v, g.param(f"w{n_params}", bz.Shape((dims[-1], 4))))
        elif step == "split" and dims[-1] % 2 == 0:
            out = draw(st.sampled_from(g.split(v, len(dims) - 1, [dims[-1] // 2] * 2)))
        elif step == "rope" and len(dims) == 4 and dims[-1] % 2 == 0:
            n_params += 1
            table = bz.Shape((dims[-2], dims[-1] // 2))
            cos, sin = (g.param(f"{t}{n_params}", table) for t in ("cos", "sin"))
            out = g.transpose(g.rope(v, cos, sin), (0, 2, 1, 3))
        if out is not None:
            vals.append(out)
    keep = draw(st.lists(st.sampled_from(vals[1:] or vals), min_size=1, max_size=3,
                         unique=True))
    g.set_outputs([vals[-1], *[k for k in keep if k != vals[-1]]])
    return g


def _misses(res):
    return sorted((m.pattern, m.node, m.reason.name, m.detail) for m in res.misses)


# the same rules without a reach: every sweep tries them at every node
WHOLE = tuple(dataclasses.replace(r, depth=None, reads_users=0) for r in RULES)


@settings(max_examples=150, deadline=None)
@given(g=layout_graphs())
def test_layout_rules_near_the_changes_match_whole_sweeps(g):
    near = rewrite(g, RULES, max_sweeps=32)
    whole = rewrite(g, WHOLE, max_sweeps=32)
    assert graph_diff(near.graph, whole.graph) is None
    assert near.changed == whole.changed and _misses(near) == _misses(whole)
    assert {k: s.matches for k, s in near.stats.items()} == \
        {k: s.matches for k, s in whole.stats.items()}
    assert_equivalent(g, near.graph, rtol=1e-4, atol=1e-5)
