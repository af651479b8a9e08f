"""A per-graph memo for what a matcher derives from a whole graph at once (the nodes where a
rule can match at all): computed once per graph object, and again when the graph has grown
or had nodes changed otherwise (`GraphCore.edits`: a node replaced in place, nodes dropped)."""
from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_KEPT = 64  # graphs remembered per memo (older ones are dropped all at once)


def per_graph(compute: Callable[[object], T]) -> Callable[[object], T]:
    """`compute(g)`, kept per graph (by identity, checked through a weak reference, so an id
    reused by a later graph is never mistaken for it), node count and edit count."""
    cache: dict[int, tuple[weakref.ref, tuple[int, int], T]] = {}

    @functools.wraps(compute)
    def get(g) -> T:
        hit = cache.get(id(g))
        size = (len(g.nodes), g.edits)
        if hit is not None and hit[0]() is g and hit[1] == size:
            return hit[2]
        value = compute(g)
        if len(cache) >= _KEPT:
            cache.clear()
        cache[id(g)] = (weakref.ref(g), size, value)
        return value

    return get
