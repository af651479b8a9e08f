"""ONNX subgraphs (If branches, Loop and Scan bodies) as the importer sees them: which graph
attributes a node holds, and which outer-scope names a subgraph reads.

ONNX subgraphs read outer values by name, without declaring them (implicit captures). A name a
subgraph defines itself (its inputs, initializers, node outputs) shadows an outer one of the
same name, in that subgraph and in the subgraphs nested in it. braze bodies are closed, so the
importer turns each capture into a body input (or, for a compile-time value, keeps it known
inside the body) and passes the outer value in as an operand."""
from __future__ import annotations

from ...errors import FrontendError
from ...ir.graph import Graph
from .context import Body, ImportContext, NodeView, Tensor
from .known import Known
from .loader import proto_str

__all__ = ["GRAPH_ATTRIBUTE", "GRAPHS_ATTRIBUTE", "node_subgraphs", "graph_captures",
           "node_captures", "SubgraphImports"]

_str = proto_str

GRAPH_ATTRIBUTE, GRAPHS_ATTRIBUTE = 5, 10  # AttributeProto.AttributeType


def node_subgraphs(node_proto) -> list:
    """The GraphProtos held in a NodeProto's attributes, in attribute order."""
    out = []
    for a in node_proto.attribute:
        if a.type == GRAPH_ATTRIBUTE:
            out.append(a.g)
        elif a.type == GRAPHS_ATTRIBUTE:
            out.extend(a.graphs)
    return out


def graph_captures(gp) -> list[str]:
    """The names subgraph `gp` (and the subgraphs nested in it) reads from outer scopes, in
    order of first use: what it reads minus what it defines."""
    defined = {proto_str(v.name) for v in gp.input}
    defined |= {proto_str(t.name) for t in gp.initializer}
    defined |= {proto_str(t.values.name) for t in gp.sparse_initializer}
    for n in gp.node:
        defined.update(proto_str(o) for o in n.output if o)
    free: dict[str, None] = {}
    for n in gp.node:
        for x in (*(proto_str(i) for i in n.input), *node_captures(n)):
            if x and x not in defined:
                free.setdefault(x)
    for v in gp.output:
        name = proto_str(v.name)
        if name not in defined:
            free.setdefault(name)
    return list(free)


def node_captures(node_proto) -> list[str]:
    """The outer names a node's subgraphs read (the union over its graph attributes)."""
    free: dict[str, None] = {}
    for sub in node_subgraphs(node_proto):
        free.update(dict.fromkeys(graph_captures(sub)))
    return list(free)


class SubgraphImports:
    """The importer's half that imports subgraphs (mixed into the ONNX importer): a child
    importer per subgraph, sharing the model's label, opset and recorded assumptions, whose
    env holds only the subgraph's formals, captures and initializers (so inner names shadow
    outer ones)."""

    def _scope(self, ctx: ImportContext, g: Graph, prefix: str) -> SubgraphImports:
        """An importer for a subgraph of `ctx`'s graph, building into `g`."""
        child = object.__new__(type(self))
        child.__dict__.update(self.__dict__)
        child.g, child.payloads, child.prefix = g, [], prefix
        child.in_body = self.in_body or g is not ctx.g
        child.ctx = ImportContext(g, self.opset, self.label, scopes=child,
                                  root=ctx.root or ctx)
        return child

    def _run_scope(self, gp, node: NodeView) -> list[Tensor]:
        """Convert subgraph `gp`'s nodes (its env holds its formals and captures); its outputs."""
        nodes = self._checked_views(gp)
        self._initializers(gp)
        for n in self._topological(nodes):
            self._convert(n)
        outs = []
        for vi in gp.output:
            t = self.ctx.env.get(_str(vi.name))
            if t is None:
                raise FrontendError(f"{self.label}: node {node.label}: subgraph {_str(gp.name)!r} "
                                    f"output {_str(vi.name)!r} is produced by nothing in it")
            outs.append(t)
        return outs

    def _subgraph(self, node: NodeView, attr: str):
        gp = node.attrs.get(attr)
        if gp is None or not hasattr(gp, "node"):
            raise FrontendError(f"{self.label}: node {node.label} lacks its graph attribute "
                                f"{attr!r}")
        return gp

    def import_body(self, ctx: ImportContext, node: NodeView, attr: str, formals, name: str
                    ) -> Body:
        """`ImportContext.body`: subgraph `attr` as a closed graph whose inputs are the
        formals given as Shapes, then the captured outer values (node.captures, the union
        over the node's subgraphs, so every body of the node takes the same operands)."""
        gp = self._subgraph(node, attr)
        if len(formals) != len(gp.input):
            raise FrontendError(f"{self.label}: node {node.label}: subgraph {attr!r} takes "
                                f"{len(gp.input)} inputs; {node.op_type} gives it {len(formals)}")
        body = Graph(name, record_provenance=False)
        env: dict[str, Tensor] = {}
        for vi, what in zip(gp.input, formals):
            if isinstance(what, Known):
                env[_str(vi.name)] = Tensor(known=what)
            else:
                env[_str(vi.name)] = Tensor(value=body.input(_str(vi.name), what))
        captures = []
        for cname in node.captures:
            outer = ctx.env.get(cname)
            if outer is None:
                raise FrontendError(f"{self.label}: node {node.label}: its subgraph reads "
                                    f"{cname!r}, which no outer scope defines before it")
            if outer.known is not None:
                env[cname] = Tensor(known=outer.known)
            else:
                env[cname] = Tensor(value=body.input(cname, ctx.g.shape_of(outer.value)))
                captures.append(outer.value)
        child = self._scope(ctx, body, f"{self.prefix}{node.name or node.op_type}.{attr}/")
        child.ctx.env = env
        outs = child._run_scope(gp, node)
        body.set_outputs([t.value if t.value is not None else child.ctx.materialize(t.known)
                          for t in outs])
        return Body(body, captures, [t.known for t in outs])

    def inline_body(self, ctx: ImportContext, node: NodeView, attr: str, why: str
                    ) -> list[Tensor]:
        """`ImportContext.inline`: subgraph `attr`'s nodes converted into `ctx`'s graph."""
        gp = self._subgraph(node, attr)
        if len(gp.input):
            raise FrontendError(f"{self.label}: node {node.label}: subgraph {attr!r} declares "
                                f"{len(gp.input)} inputs; an {node.op_type} branch takes none")
        child = self._scope(ctx, ctx.g, f"{self.prefix}{node.name or node.op_type}.{attr} "
                                        f"({why})/")
        child.ctx.env = {c: ctx.env[c] for c in node.captures if c in ctx.env}
        return child._run_scope(gp, node)

