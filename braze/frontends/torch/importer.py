"""An ExportedProgram (already decomposed, see exporter.py) to a braze Graph, FX node by node.

User inputs keep their names with torch's symbolic sizes as braze dims (SymbolNames);
parameters, buffers and lifted constants become params with stored values named by their
state_dict names (a linear layer's matrix as `<name>.T`, transposed once); size arithmetic folds
at import time. Every braze node records the module path of its FX node as provenance. Each
converted node is checked against the shape and dtype torch recorded for it, so a converter
mistake surfaces at its node instead of as wrong numbers downstream."""
from __future__ import annotations

from collections.abc import Mapping

from ...errors import BrazeError, FrontendError, UnsupportedOpsError
from ...ir.graph import Graph
from ...ir.op import Value
from ...ir.shapes import Shape
from ...ir.symbolic import SymDim
from ..clamps import check_assumptions
from . import ops  # noqa: F401  (registers the converters)
from .context import CONVERTERS, Lazy, LazyParam, TorchContext, target_key
from .dtypes import braze_dtype, to_numpy
from .ops.elementwise import RUNTIME_CHECKS
from .provenance import module_path, normalize_path, owner_path
from .symbolic import NotRepresentable, SymbolNames, export_excludes, scalar_value

__all__ = ["import_program", "SUPPORTED_OPS", "name_symbols"]


def SUPPORTED_OPS() -> list[str]:  # noqa: N802 - reads like the constant it is
    """The ATen overloads (and Python size functions) braze imports."""
    return sorted(CONVERTERS)


def import_program(ep, *, labels: Mapping | None = None, label: str = "module",
                   name: str | None = None) -> Graph:
    """Translate the (decomposed) ExportedProgram `ep`; `labels` names dynamic dims:
    {(input name, axis): (dim name, names a derived dim's root)}."""
    return _Importer(ep, dict(labels or {}), label, name).run()


def name_symbols(ep, labels: Mapping) -> SymbolNames:
    """torch's size symbols -> braze dim names: the user's names first, then `<input>_dim<k>`
    for the first input axis each remaining symbol sizes."""
    import sympy

    names = SymbolNames()
    inputs = [(n, n.meta.get("val")) for n in _user_inputs(ep)]
    for fallback in (False, True):
        for node, val in inputs:
            for axis, d in enumerate(getattr(val, "shape", ())):
                expr = getattr(getattr(d, "node", None), "expr", None)
                if expr is None:
                    continue
                label = labels.get((node.name, axis))
                if fallback:
                    if isinstance(expr, sympy.Symbol) or len(expr.free_symbols) == 1:
                        # a derived dim (8*h) names its root after the input axis too
                        names.bind(next(iter(expr.free_symbols)).name, f"{node.name}_dim{axis}")
                elif label is not None:
                    text, is_root = label
                    if isinstance(expr, sympy.Symbol):
                        names.bind(expr.name, text)
                    elif is_root and len(expr.free_symbols) == 1:
                        names.bind(next(iter(expr.free_symbols)).name, text)
    return names


def _user_inputs(ep) -> list:
    from torch.export.graph_signature import InputKind

    user = {s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    return [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in user]


class _Importer:
    def __init__(self, ep, labels: dict, label: str, name: str | None):
        self.ep = ep
        self._bounded: set[str] = set()  # symbols whose range an earlier input excludes
        self.labels = labels
        self.label = label
        self.g = Graph(name or "torch_model", record_provenance=False)
        self.ctx = TorchContext(self.g, name_symbols(ep, labels), label)

    def run(self) -> Graph:
        self.checks_only = _feeding_runtime_checks_only(self.ep.graph)
        self._check_supported()
        self._check_specialized()
        specs = {s.arg.name: s for s in self.ep.graph_signature.input_specs
                 if hasattr(s.arg, "name")}
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node, specs.get(node.name))
            elif node.op == "call_function":
                if node not in self.checks_only:
                    self._call(node)
            elif node.op == "output":
                self._outputs(node)
            else:
                raise FrontendError(f"{self.label}: FX node {node.name} is a {node.op}; braze "
                                    "imports flat programs (no submodule calls)")
        check_assumptions(self.g, self.ctx.names.assumed, self.label)
        return self.g


    # -- checks before translating --------------------------------------------------------------
    def _check_supported(self) -> None:
        bad: dict[str, str] = {}
        where: dict[str, str] = {}
        for node in self.ep.graph.nodes:
            if node.op == "get_attr":
                key, ok = "get_attr (control flow or submodules)", False
            elif node.op == "call_function":
                key = target_key(node.target)
                ok = key in CONVERTERS or node in self.checks_only
            else:
                continue
            if not ok and key not in bad:
                path = module_path(node)
                bad[key] = path or node.name
                where[key] = (f"in module {path!r}" if path else
                              f"node {node.name!r} in the top-level module's forward")
        if bad:
            listing = "; ".join(f"{k} ({where[k]})" for k in sorted(bad))
            raise UnsupportedOpsError(
                f"{self.label}: braze cannot import {len(bad)} op(s): {listing}. They have no "
                "decomposition into ops braze imports; rewrite the code that calls them, or see "
                "braze.frontends.torch.SUPPORTED_OPS() for what is supported", bad)

    def _check_specialized(self) -> None:
        """A dim the user named as dynamic that torch.export fixed to a number is an error:
        the graph would silently accept only that size. (torch.export's Dim.AUTO, which
        braze's named form uses, specializes without complaint; a SymInt whose expression is
        a number is as static as an int.)"""
        for node in _user_inputs(self.ep):
            val = node.meta.get("val")
            for axis, d in enumerate(getattr(val, "shape", ())):
                label = self.labels.get((node.name, axis))
                size = _static_size(d)
                if label is None or size is None:
                    continue
                raise FrontendError(
                    f"{self.label}: dim {axis} of input {node.name!r} was named "
                    f"{label[0]!r} (dynamic) but torch.export specialized it to {size}: "
                    "either the model's code only works at that size (a reshape or view to a "
                    "fixed size, a check against a constant), or the example size was 0 or 1 "
                    "(torch treats those as static). Export with an example whose size is >= 2, "
                    f"or leave dim {axis} of {node.name!r} out of dynamic_shapes to import it "
                    f"static; passing torch.export.Dim({label[0]!r}) for that dim makes "
                    f"torch.export name the code that fixes it{_recurrent_hint(self.ep)}")

    # -- sources --------------------------------------------------------------------------------
    def _placeholder(self, node, spec) -> None:
        from torch.export.graph_signature import InputKind

        ctx = self.ctx
        kind = getattr(spec, "kind", InputKind.USER_INPUT)
        if kind == InputKind.USER_INPUT:
            ctx.env[node] = self._user_input(node)
            return
        if kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            target = spec.target
            t = self.ep.state_dict.get(target)
            if t is None:
                t = self.ep.constants.get(target)
            if t is None:
                raise FrontendError(f"{self.label}: {kind.name.lower()} {target!r} has no "
                                    "stored value in the program")
            where = f"{self.label}: {target}"
            ctx.env[node] = LazyParam(target, to_numpy(t, where), owner_path(target))
            return
        raise FrontendError(f"{self.label}: input {node.name!r} is a {kind.name.lower()}; braze "
                            "imports tensor inputs, parameters, buffers and constants")

    def _user_input(self, node):
        val = node.meta.get("val")
        ctx = self.ctx
        if val is None or not hasattr(val, "shape"):
            try:
                return scalar_value(ctx.names, val)
            except NotRepresentable as e:
                raise FrontendError(f"{self.label}: input {node.name!r}: {e}") from None
        dt = braze_dtype(val.dtype, f"{self.label}: input {node.name!r}")
        try:
            dims = tuple(ctx.names.dim(d) for d in val.shape)
        except NotRepresentable as e:
            raise FrontendError(f"{self.label}: input {node.name!r}: {e}") from None
        with self.g.provenance_scope(f"input {node.name}"):
            return self.g.input(node.name, Shape(dims, dt),
                                export_excludes(self.ep, ctx.names, val.shape, self._bounded))

    # -- one node -------------------------------------------------------------------------------
    def _call(self, node) -> None:
        ctx = self.ctx
        ctx.node = node
        ctx.provenance = module_path(node)
        fn = CONVERTERS[target_key(node.target)]
        try:
            with self.g.provenance_scope(ctx.provenance or node.name):
                out = fn(ctx, ctx.bind(node))
                out = self._agree(out)
                ctx.exclude_decided()
        except FrontendError:
            raise
        except BrazeError as e:
            raise ctx.fail(str(e)) from e
        except (ValueError, TypeError, KeyError, IndexError, AttributeError,
                NotImplementedError, NotRepresentable) as e:
            raise ctx.fail(f"could not be imported ({type(e).__name__}: {e})") from e
        ctx.env[node] = out

    def _agree(self, out):
        """`out` checked against torch's recorded type: a dtype that differs (a promotion
        torch made implicitly) is cast; different dims are a converter error."""
        if isinstance(out, Value):
            return self._agree_one(out, None)
        if isinstance(out, tuple):
            return tuple(self._agree_one(v, i) if isinstance(v, Value) else v
                         for i, v in enumerate(out))
        return out

    def _agree_one(self, v: Value, index: int | None) -> Value:
        ctx = self.ctx
        val = ctx.meta(index)
        if val is None or not hasattr(val, "shape"):
            return v
        try:
            dims = ctx.out_dims(index)
        except FrontendError:
            return v  # torch's size is not a polynomial: nothing to compare against
        got = ctx.dims(v)
        if tuple(SymDim.of(d) for d in got) != tuple(SymDim.of(d) for d in dims):
            raise ctx.fail(f"braze computed dims {got} where torch.export recorded {dims}")
        return ctx.cast(v, ctx.out_dtype(index))

    # -- results --------------------------------------------------------------------------------
    def _outputs(self, node) -> None:
        from torch.export.graph_signature import OutputKind

        specs = self.ep.graph_signature.output_specs
        outs = node.args[0]
        values = []
        for i, (spec, arg) in enumerate(zip(specs, outs)):
            if spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
                continue  # buffer / input mutations: braze graphs are functional
            v = self.ctx.resolve(arg)
            if isinstance(v, Lazy):
                v = v.get()
            if v is None:
                raise FrontendError(f"{self.label}: output {i} is None; return tensors only")
            self.ctx.node = None
            with self.g.provenance_scope("output"):
                values.append(self.ctx.value(v))
        if not values:
            raise FrontendError(f"{self.label}: the program returns no tensors")
        self.g.set_outputs(values)


_RECURRENT = ("torch.nn.modules.rnn.LSTM", "torch.nn.modules.rnn.GRU",
              "torch.nn.modules.rnn.RNN")


def _recurrent_hint(ep) -> str:
    """A note naming the program's nn.LSTM / nn.GRU / nn.RNN modules, whose torch
    decomposition unrolls the sequence (so it always fixes the sequence length)."""
    found = set()
    for node in ep.graph.nodes:
        for entry in (node.meta.get("nn_module_stack") or {}).values():
            if isinstance(entry, tuple) and len(entry) > 1 and str(entry[1]) in _RECURRENT:
                kind = f"nn.{str(entry[1]).rsplit('.', 1)[1]}"
                path = normalize_path(entry[0])
                found.add(f"{kind} {path!r}" if path else kind)
    if not found:
        return ""
    return (f". The program runs {', '.join(sorted(found))}: torch.export unrolls recurrent "
            "layers step by step, so their sequence length is always static; leave the "
            "sequence dim out of dynamic_shapes (the graph then runs that length only)")


def _static_size(d) -> int | None:
    """The size of an input dim when torch.export fixed it (an int, or a SymInt whose
    expression is a number), else None."""
    if isinstance(d, int):
        return d
    expr = getattr(getattr(d, "node", None), "expr", None)
    if expr is not None and getattr(expr, "is_number", False):
        return int(expr)
    return None


def _feeding_runtime_checks_only(graph) -> set:
    """The FX nodes whose results reach nothing but torch.export's run-time assertions (XLM's
    `assert lengths.max().item() <= slen` reads a tensor into a Python number: `.item()`,
    a comparison, `_assert_scalar`). braze drops the assertions, so these are dead; skipping
    them keeps a data-dependent op that only a check reads from blocking the import."""
    dead: set = set()
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function" or not node.users:
            if node.op == "call_function" and target_key(node.target) in RUNTIME_CHECKS:
                dead.add(node)
            continue
        if all(u in dead for u in node.users):
            dead.add(node)
    return dead
