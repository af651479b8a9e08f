"""Matrix products: linear (its [out, in] weight stored transposed once, as `<name>.T`, so the
graph reads `x @ w + b` the way braze's fusions expect), addmm / baddbmm (beta, alpha), mm, bmm,
matmul, mv and dot: all braze `matmul` (NumPy semantics, batch dims broadcast)."""
from __future__ import annotations

from ....ir.ops.elementwise import BinaryFn
from ..context import Call, converter
from .elementwise import binary


@converter("aten.linear.default")
def linear(ctx, c: Call):
    dt = ctx.out_dtype()
    x = ctx.value(c["input"], dt)
    y = ctx.g.matmul(x, ctx.cast(ctx.weight_t(c["weight"]), dt))
    b = c.args.get("bias")
    return y if b is None else ctx.g.add(y, ctx.value(b, dt))


@converter("aten.mm.default", "aten.bmm.default", "aten.matmul.default", "aten.mv.default",
           "aten.dot.default", "aten.vdot.default")
def matmul(ctx, c):
    dt = ctx.out_dtype()
    a = ctx.value(c["self"], dt)
    b = ctx.value(c.args.get("mat2", c.args.get("other", c.args.get("vec", c.args.get("tensor")))),
                  dt)
    return ctx.g.matmul(a, b)


def _affine_product(ctx, c: Call, p):
    """beta * self + alpha * p, leaving out factors of 1 and a zero beta."""
    beta, alpha = c.get("beta", 1), c.get("alpha", 1)
    if alpha != 1:
        p = binary(ctx, p, alpha, BinaryFn.MUL)
    if beta == 0:
        return p
    s = ctx.value(c["self"], ctx.out_dtype())
    if beta != 1:
        s = binary(ctx, s, beta, BinaryFn.MUL)
    return ctx.g.add(p, s)


@converter("aten.addmm.default", "aten.baddbmm.default", "aten.addmv.default",
           "aten.addbmm.default")
def addmm(ctx, c):
    dt = ctx.out_dtype()
    first = c.args.get("mat1", c.args.get("batch1", c.args.get("mat")))
    second = c.args.get("mat2", c.args.get("batch2", c.args.get("vec")))
    p = ctx.g.matmul(ctx.value(first, dt), ctx.value(second, dt))
    if c.key == "aten.addbmm.default":
        p = ctx.g.sum(p, 0)
    return _affine_product(ctx, c, p)
