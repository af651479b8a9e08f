"""Size arithmetic folds at import time: `sym_size`, `sym_numel` and the Python operators
torch.export records on SymInts (s0 * s1, s1 + 1, s0 // 2, comparisons, sym_max) become braze
SymDims (or ints, bools) read off the expression torch recorded for the node, so reshape /
expand / arange targets keep symbolic dims. `getitem` picks one result of a multi-output op."""
from __future__ import annotations

from ..context import Call, Lazy, TorchContext, converter
from ..symbolic import NotRepresentable, scalar_value

_SYM_OPS = ("aten.sym_size.int", "aten.sym_numel.default", "aten.sym_storage_offset.default",
            "operator.add", "operator.sub", "operator.mul", "operator.floordiv",
            "operator.truediv", "operator.mod", "operator.neg", "operator.pow", "operator.eq",
            "operator.ne", "operator.lt", "operator.le", "operator.gt", "operator.ge",
            "operator.and_", "operator.or_", "operator.not_", "torch.sym_max", "torch.sym_min",
            "torch.sym_float", "torch.sym_int", "torch.sym_not", "torch.sym_sum",
            "math.ceil", "math.floor", "builtins.round", "torch.sym_ite",
            "torch._sym_sqrt", "math.sqrt")


@converter(*_SYM_OPS)
def sym_scalar(ctx: TorchContext, c: Call):
    """The size expression torch recorded for this node, as a braze scalar."""
    val = c.node.meta.get("val")
    if val is None:
        raise ctx.fail("torch.export recorded no value for this size computation")
    try:
        return scalar_value(ctx.names, val)
    except NotRepresentable as e:
        raise ctx.fail(str(e)) from None


@converter("aten.sym_stride.int")
def sym_stride(ctx, c):
    raise ctx.fail("the model reads a tensor stride; braze tensors have no strides (use "
                   "shapes instead)")


@converter("operator.getitem")
def getitem(ctx, c):
    seq, i = c["a0"], c["a1"]
    if not isinstance(seq, (list, tuple)):
        raise ctx.fail(f"getitem on {type(seq).__name__}, not on the results of a multi-output "
                       "op")
    v = seq[i]
    return v.get() if isinstance(v, Lazy) else v
