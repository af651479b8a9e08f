"""The kernel registry: kernels register against op classes, as the interpreter's references do.

A kernel factory `make(node, ins, outs, ctx)` gets the node and its concrete input / output
types (static dims: the executable is planned per binding of the symbolic dims) and returns a
`Kernel`, or None to decline (the op then runs its NumPy reference). Kernels are tested against
the reference interpreter, never the other way round."""
from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...ir.node import Node
from ...ir.op import Op
from ...ir.shapes import Shape

__all__ = ["Kernel", "KernelContext", "Preparations", "register_kernel", "kernel_for",
           "has_empty", "KERNELS", "Dispatch", "LIBRARIES", "register_library", "libraries_for"]


class Dispatch:
    """How a node runs: the four answers `dispatch_report()` gives."""

    NATIVE = "native"            # a hand-written kernel (BLAS, numba, NumPy vectorized)
    GENERATED = "generated"      # code generated from the node (regions, epilogues)
    DECOMPOSED = "decomposition"  # legalized into other ops that have kernels
    REFERENCE = "reference"      # the op's NumPy reference, no kernel
    VIEW = "view"                # no work: a view of its input's memory
    STATIC = "static"            # computed once, when the program is built (weight prep)


@dataclass
class KernelContext:
    """What a kernel factory may consult: thread count, precision policy, the symbol binding,
    and the static values (weights and weight preparation, by graph value) already computed
    for this program, which a kernel may prepare further once (e.g. pack a GEMM weight).
    `prepared` caches such preparations, keyed by tuples naming the value, across the
    executable's programs (see Preparations); it is emptied when the weights change.
    `rounded` maps each value computed as `cast(cast(a, bf16), f32)` (the precision policy's
    rounding of an operand) to `a`: a kernel that rounds `a` itself may read it instead
    (`Kernel.reads`). `handoff` maps each value computed as `cast(b, f32)`
    from bf16 values `b` that an earlier step writes itself (a GEMM rounding its product for
    the next GEMM, fused.rounded_output) to `b`: a bf16 GEMM reads `b` as its operand.
    `channels_last` holds the 4-d values the executor stores NHWC instead of NCHW (the convs'
    activations, runtime/layout.py): a kernel reading or writing one of them must say it
    takes that layout (`Kernel.channels_last`). `build_limits` bounds the time and count of
    this program's kernel builds and `unbuilt` maps the library key of each generated kernel
    that was not built to the limit reached, or to None where its build failed
    (codegen.builds): its node falls back to the reference, with that reason."""

    threads: int = 0
    precision: Any = None
    symbols: dict[str, int] = field(default_factory=dict)
    static: dict[Any, np.ndarray] = field(default_factory=dict)
    prepared: dict[Any, Any] = field(default_factory=dict)
    rounded: dict[Any, Any] = field(default_factory=dict)
    handoff: dict[Any, Any] = field(default_factory=dict)
    channels_last: frozenset = frozenset()
    build_limits: Any = None
    unbuilt: dict[str, str | None] = field(default_factory=dict)


class Preparations(MutableMapping):
    """KernelContext.prepared for one program: the executable's `shared` cache, but for keys
    naming a value of `binds` (a static value that differs between bindings of the symbols,
    `w * seq`: one key, other numbers per binding), which this program keeps to itself."""

    def __init__(self, shared: dict, binds: frozenset) -> None:
        self.shared, self.binds, self.own = shared, binds, {}

    def _home(self, key) -> dict:
        parts = key if isinstance(key, tuple) else (key,)
        return self.own if any(p in self.binds for p in parts) else self.shared

    def __getitem__(self, key):
        return self._home(key)[key]

    def __setitem__(self, key, value) -> None:
        self._home(key)[key] = value

    def __delitem__(self, key) -> None:
        del self._home(key)[key]

    def __iter__(self) -> Iterator:
        yield from self.own
        yield from self.shared

    def __len__(self) -> int:
        return len(self.own) + len(self.shared)


@dataclass
class Kernel:
    """`run(*inputs, *outputs)` writes the outputs (preallocated, C-contiguous) from the
    inputs. `dispatch` says what it is; `name` names the implementation for reports;
    `inplace` lists input positions whose buffer the first output may share (an elementwise
    kernel reading element i before writing it); `scratch` lists temporary buffers (shape,
    NumPy dtype) the memory plan gives it for the duration of its step, passed after the
    outputs; `flops` / `bytes` estimate one run for the profile. `bind(*inputs, *outputs,
    *scratch)`, when given, returns a zero-argument call doing what `run` does on exactly those
    arrays: the executor binds every step once per program (its arrays never move), so a
    kernel can compute pointers, views and argument tuples there instead of on every call.
    `reads` lists (input position, value): the kernel gets that value's array at that
    position instead of the node's input (a GEMM reading the unrounded operand and rounding it
    to bf16 itself, see KernelContext.rounded); steps whose results nothing reads then are
    dropped. `channels_last`: the kernel reads and writes the node's values in the layout
    KernelContext.channels_last gives them (NHWC for those in it, else NCHW)."""

    run: Callable[..., None]
    dispatch: str = Dispatch.NATIVE
    name: str = ""
    inplace: tuple[int, ...] = ()
    flops: int = 0
    bytes: int = 0
    scratch: tuple[tuple[tuple[int, ...], object], ...] = ()
    bind: Callable[..., Callable[[], None]] | None = None
    reads: tuple[tuple[int, Any], ...] = ()
    channels_last: bool = False


KernelFactory = Callable[[Node, Sequence[Shape], Sequence[Shape], KernelContext], "Kernel | None"]
KERNELS: dict[type[Op], list[KernelFactory]] = {}


def register_kernel(*op_classes: type[Op]):
    """Register a factory for these op classes; later registrations are tried first."""

    def deco(fn: KernelFactory) -> KernelFactory:
        for cls in op_classes:
            KERNELS.setdefault(cls, []).insert(0, fn)
        return fn

    return deco


LibraryFactory = Callable[[Node, Sequence[Shape], Sequence[Shape], KernelContext], "Any | None"]
LIBRARIES: dict[type[Op], list[LibraryFactory]] = {}


def register_library(*op_classes: type[Op]):
    """Register `libraries(node, ins, outs, ctx)` for these op classes: the generated C library
    (a codegen.builds.Library) the node's kernel will load, or None. A program builds them all
    in parallel before it picks its kernels (codegen.builds.build_all)."""

    def deco(fn: LibraryFactory) -> LibraryFactory:
        for cls in op_classes:
            LIBRARIES.setdefault(cls, []).append(fn)
        return fn

    return deco


def libraries_for(node: Node, ins: Sequence[Shape], outs: Sequence[Shape], ctx: KernelContext
                  ) -> list:
    """The generated libraries the kernels registered for `node` will load."""
    if has_empty(ins, outs):
        return []
    found = []
    for cls in type(node.op).__mro__:
        for make in LIBRARIES.get(cls, ()):
            lib = make(node, ins, outs, ctx)
            if lib is not None:
                found.append(lib)
    return found


def has_empty(ins: Sequence[Shape], outs: Sequence[Shape]) -> bool:
    """Whether a node reads or makes an empty tensor. Such a node runs its NumPy reference:
    from an empty input (a K = 0 matmul, a reduction over a zero-length axis) the reference
    gives the identities (zeros, -inf for a max) the interpreter does, and into an empty
    output (a batch or a width of 0) there is nothing to compute, while the native kernels'
    blockings divide by their block counts (a fed-weight GEMM of 0 rows raised SIGFPE)."""
    return any(s.numel() == 0 for s in (*ins, *outs))


def kernel_for(node: Node, ins: Sequence[Shape], outs: Sequence[Shape], ctx: KernelContext
               ) -> Kernel | None:
    """The first registered kernel that accepts this node, or None (the NumPy reference);
    None for a node with an empty tensor (has_empty)."""
    if has_empty(ins, outs):
        return None
    for cls in type(node.op).__mro__:
        for make in KERNELS.get(cls, ()):
            k = make(node, ins, outs, ctx)
            if k is not None:
                return k
    return None


def nbytes(shapes: Sequence[Shape]) -> int:
    return sum((s.numel() or 0) * s.dtype.itemsize for s in shapes)


def as_np(shape: Shape) -> tuple[tuple[int, ...], np.dtype]:
    return tuple(int(d) for d in shape.dims), shape.dtype.np
