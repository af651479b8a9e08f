"""Import decisions taken for symbols >= 2, checked at sizes 0 and 1.

Importers decide size questions under braze's "every symbol is >= 2" assumption (a slice end
`2*seq - 2` is past the axis end, `max(n - 1, 1)` is `n - 1`); so does torch.export, whose
programs are traced for sizes >= 2. Such a decision can be wrong at a smaller binding. Each
decision is checked with every symbol in turn at 0 and 1 (the others at 2); a binding where it
fails becomes an exclusion of the graph input naming the symbol (`Input.excludes`), so feeding
it is refused, naming the node, rather than run with a wrong result."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from ..ir.graph import Graph
from ..ir.symbolic import MIN_SYMBOL_VALUE, SymDim

__all__ = ["small_bindings", "failing_small_bindings", "exclude_binding"]

SMALL_SIZES = (0, 1)


def small_bindings(symbols: Iterable[str]) -> Iterator[tuple[str, int, dict[str, int]]]:
    """(symbol, value, binding) for each symbol at 0 and 1, the others at 2."""
    syms = sorted(set(symbols))
    for sym in syms:
        for value in SMALL_SIZES:
            yield sym, value, {**dict.fromkeys(syms, MIN_SYMBOL_VALUE), sym: value}


def failing_small_bindings(symbols: Iterable[str],
                           holds: Callable[[dict[str, int]], bool]) -> list[tuple[str, int]]:
    """The (symbol, value) small bindings (see `small_bindings`) where `holds(binding)` is
    False: where a decision taken for symbols >= 2 gives another answer."""
    return [(s, v) for s, v, env in small_bindings(symbols) if not holds(env)]


def exclude_binding(g: Graph, dim, value: int, why: str) -> None:
    """Record on the first input of `g` whose shape names a symbol of `dim` that binding `dim`
    to `value` is refused, saying `why` (once: an equal exclusion is not repeated). The input
    node is replaced in place: an importer owns its graph, and an input's shape (what readers
    were typed against) does not change."""
    syms = SymDim.of(dim).symbols
    for nid in g.input_ids:
        n = g.nodes[nid]
        if syms & {s for d in n.op.shape.dims for s in SymDim.of(d).symbols}:
            if any(e[:3] == (dim, value, value) for e in n.op.excludes):
                return
            op = replace(n.op, excludes=(*n.op.excludes, (dim, value, value, why)))
            g.nodes[nid] = replace(n, op=op)
            g.edits += 1
            return
