"""`Graph`: the container (see graph_core) plus the builder surface (see builder/)."""
from __future__ import annotations

from .builder.attention import AttentionBuilder
from .builder.backward import BackwardBuilder
from .builder.control import ControlFlowBuilder
from .builder.conv import ConvBuilder
from .builder.custom import CustomBuilder
from .builder.elementwise import ElementwiseBuilder
from .builder.fused import FusedBuilder
from .builder.linalg import LinalgBuilder
from .builder.loss import LossBuilder
from .builder.norm import NormBuilder
from .builder.quant import QuantBuilder
from .builder.reduce import ReduceBuilder
from .builder.scan import ScanBuilder
from .builder.shape import ShapeBuilder
from .builder.sources import SourceBuilder
from .graph_core import GraphCore
from .graph_queries import GraphQueries


class Graph(
    SourceBuilder,
    ElementwiseBuilder,
    LinalgBuilder,
    LossBuilder,
    NormBuilder,
    QuantBuilder,
    ReduceBuilder,
    ShapeBuilder,
    AttentionBuilder,
    ConvBuilder,
    FusedBuilder,
    BackwardBuilder,
    CustomBuilder,
    ScanBuilder,
    ControlFlowBuilder,
    GraphQueries,
    GraphCore,
):
    """A model graph: append-only nodes in topological order, inputs, params, outputs.

    Build it with the methods of the builder mixins (`g.input`, `g.param`, `g.mm`, `g.add`,
    `g.gelu`, ...); shapes are inferred. `print(g)` shows text IR; `Graph.parse` reads it."""

    def __str__(self) -> str:
        from .printer import print_graph

        return print_graph(self)

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {len(self.nodes)} nodes, {len(self.outputs)} outputs>"

    @classmethod
    def parse(cls, text: str) -> Graph:
        """Read text IR written by `str(graph)`."""
        from .parser import parse_graph

        return parse_graph(text)

    def __eq__(self, other) -> bool:
        from .equality import graphs_equal

        return isinstance(other, Graph) and graphs_equal(self, other)

    __hash__ = object.__hash__
