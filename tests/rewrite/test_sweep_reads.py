"""Within one sweep, a match may not remove a value that a match accepted earlier in the sweep
reads as an input (through nodes that match leaves in place): the later match is skipped and
tried again next sweep, unless its replacement provides that value. Without the guard the
rebuild lost the value and the driver raised on a valid graph."""
import braze as bz
from braze.ir.ops.shape import Reshape, Transpose
from braze.passes.canonicalize.layout import COMPOSE_TRANSPOSES
from braze.rewrite import Match, RewriteContext, Rule, rewrite, rewrite_once
from braze.testing import assert_equivalent


def _folding_rule(name: str, root_kind: type) -> Rule:
    """op(reshape(x)) where the reshape has no other reader: both are consumed and the same
    two ops built again (a rule folding its producer in, as layout rules do)."""
    holder: list[Rule] = []

    def matcher(g, node, ctx):
        inner = g.nodes[node.inputs[0].node]
        if isinstance(inner.op, Reshape) and len(g.users(inner.id)) == 1:
            yield Match(holder[0], g, node, {"root": node, "inner": inner},
                        {"x": inner.inputs[0]}, (node.id, inner.id))

    def build(b, m):
        return b.add_node(m.root.op, [b.add_node(m.op("inner"), [m.v("x")])[0]])[0]

    rule = Rule(name, build, matcher=matcher, root_test=lambda op: isinstance(op, root_kind),
                depth=2, reads_users=1)
    holder.append(rule)
    return rule


TRANSPOSE_OF_RESHAPE = _folding_rule("TransposeOfReshape", Transpose)
RESHAPE_OF_RESHAPE = _folding_rule("ReshapeOfReshape", Reshape)


def test_a_match_does_not_remove_what_an_accepted_match_reads():
    """transpose(transpose(reshape(x))): ComposeTransposes at the outer transpose reads the
    reshape; the folding rule at the inner transpose would consume that reshape."""
    g = bz.Graph("reads")
    x = g.input("x", bz.Shape((2, 3, 4, 5)))
    t1 = g.transpose(g.reshape(x, (6, 4, 5)), (0, 2, 1))
    g.set_outputs([g.transpose(t1, (1, 0, 2))])
    first = rewrite_once(g, (COMPOSE_TRANSPOSES, TRANSPOSE_OF_RESHAPE), RewriteContext())
    assert first.stats["ComposeTransposes"].matches == 1
    assert first.stats["TransposeOfReshape"].matches == 0  # skipped, not a miss
    assert not first.misses
    res = rewrite(g, (COMPOSE_TRANSPOSES, TRANSPOSE_OF_RESHAPE))
    (t,) = [n for n in res.graph.nodes if n.op.kind == "transpose" and
            res.graph.is_output(n.value)]
    assert t.op.perm == (2, 0, 1)
    assert_equivalent(g, res.graph)


def test_a_match_providing_the_value_it_consumes_is_taken_in_the_same_sweep():
    """The accepted match reads the value of the later match's root: the root is provided."""
    g = bz.Graph("provided")
    x = g.input("x", bz.Shape((2, 3, 4, 5)))
    r = g.reshape(g.reshape(x, (6, 20)), (6, 4, 5))
    g.set_outputs([g.transpose(g.transpose(r, (0, 2, 1)), (1, 0, 2))])
    first = rewrite_once(g, (COMPOSE_TRANSPOSES, RESHAPE_OF_RESHAPE), RewriteContext())
    assert first.stats["ComposeTransposes"].matches == 1
    assert first.stats["ReshapeOfReshape"].matches == 1
    assert_equivalent(g, first.graph)

