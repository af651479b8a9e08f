"""Helpers the lowering tests share (this folder is on sys.path under pytest's default import
mode, as every test folder without __init__.py is)."""
from collections import Counter


def op_counts(g) -> Counter:
    """How many nodes of each op label `g` has, sources (inputs, params, constants) left out."""
    return Counter(n.op.label for n in g.nodes if not n.op.source)
