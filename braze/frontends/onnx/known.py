"""Compile-time values during ONNX import: shape computations (Shape -> Gather -> Unsqueeze ->
Concat -> Reshape, masks of ones, position ids) fold into NumPy arrays whose integer entries may
be symbolic dims (`SymDim`, in object arrays). Folding is an optimization with a fallback: a value
that cannot be folded is materialized (`constant` or `sym_const`) and computed at run time.

`FOLDERS` maps an ONNX op type to a function (node attrs, known inputs, opset) -> known outputs,
or raises NotFoldable. Decisions about symbols use the "every symbol is >= 2" assumption of
braze.ir.symbolic (a symbolic dim is never -1, 0 or 1)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...ir.dtypes import DType, bool_, f32, i64
from ...ir.symbolic import SymDim

__all__ = ["Known", "NotFoldable", "FOLDERS", "is_symbolic_array", "as_dims", "scatter_nd",
           "onnx_slice"]


class NotFoldable(Exception):
    """This node's result cannot be computed at import time (it is computed at run time)."""


@dataclass(frozen=True)
class Known:
    """A compile-time tensor: `array` is numeric, or object dtype holding ints and SymDims;
    `dtype` is the braze dtype the value has in the model."""

    array: np.ndarray
    dtype: DType

    @property
    def symbolic(self) -> bool:
        return is_symbolic_array(self.array)

    def ints(self) -> list:
        """Entries as ints / SymDims (constant SymDims become ints)."""
        return [_norm(v) for v in self.array.reshape(-1).tolist()]


def is_symbolic_array(a: np.ndarray) -> bool:
    return a.dtype == object


def _norm(v):
    if isinstance(v, SymDim):
        return v.const if v.is_const else v
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    return v


def _obj(a) -> np.ndarray:
    """An object array with SymDim entries simplified to ints where constant."""
    a = np.asarray(a, dtype=object) if not isinstance(a, np.ndarray) else a
    out = np.empty(a.shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(a.reshape(-1).tolist()):
        flat[i] = _norm(v)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        return out.astype(np.int64)
    return out


def as_dims(k: Known) -> tuple:
    """The entries as dims (ints or canonical symbol strings)."""
    return tuple(v if isinstance(v, int) else v.to_dim() for v in k.ints())


def onnx_slice(size: int, start: int, end: int, step: int) -> slice:
    """ONNX Slice's bounds on an axis of `size` as a Python slice with the same elements. They
    differ where a bound is out of range: ONNX clamps a negative-step start to [0, size-1]
    (`x[-9::-1]` of 4 elements is x[0], not empty as in Python)."""
    lo, hi = (start + size if start < 0 else start), (end + size if end < 0 else end)
    if step > 0:
        return slice(min(max(lo, 0), size), min(max(hi, 0), size), step)
    lo, hi = min(max(lo, 0), size - 1), min(max(hi, -1), size - 1)
    return slice(lo, hi if hi >= 0 else None, step)


# -- folders ------------------------------------------------------------------------------------
Folder = Callable[[dict, list, int], list]
FOLDERS: dict[str, Folder] = {}


def folder(*op_types: str):
    def deco(fn: Folder) -> Folder:
        for t in op_types:
            FOLDERS[t] = fn
        return fn

    return deco


def _need_sym(ins: list) -> None:
    if not any(k.symbolic for k in ins if k is not None):
        raise NotFoldable("numeric: the generic folder handles it")


def _like(a: np.ndarray, k: Known) -> np.ndarray:
    """A data-movement result of `k`'s array: SymDim entries normalized, numbers as they are."""
    return _obj(a) if k.symbolic else a


@folder("Identity")
def _identity(attrs, ins, opset):
    return [ins[0]]


@folder("Cast", "CastLike")
def _cast(attrs, ins, opset):
    from .dtypes import onnx_dtype

    to = onnx_dtype(attrs["to"]) if "to" in attrs else ins[1].dtype
    k = ins[0]
    if not k.symbolic:
        return [Known(np.asarray(k.array).astype(to.np), to)]
    if not (to.is_int or to.is_float):
        raise NotFoldable("a symbol cast to a non-number")
    return [Known(k.array, to)]


@folder("Gather")
def _gather(attrs, ins, opset):
    data, idx = ins
    if idx.symbolic or not np.issubdtype(idx.array.dtype, np.integer):
        raise NotFoldable("symbolic or non-integer indices")
    axis = attrs.get("axis", 0)
    return [Known(_like(np.take(data.array, idx.array.astype(np.int64), axis=axis), data),
                  data.dtype)]


@folder("Unsqueeze")
def _unsqueeze(attrs, ins, opset):
    axes = attrs["axes"] if "axes" in attrs else [int(v) for v in ins[1].ints()]
    a = ins[0].array
    out_rank = a.ndim + len(axes)
    shape = list(a.shape)
    where = sorted(x % out_rank for x in axes)
    if len(set(where)) != len(where) or any(not -out_rank <= x < out_rank for x in axes):
        raise NotFoldable("bad axes: the converter reports them")
    for ax in where:
        shape.insert(ax, 1)
    return [Known(a.reshape(shape), ins[0].dtype)]


@folder("Squeeze")
def _squeeze(attrs, ins, opset):
    a = ins[0].array
    if "axes" in attrs or (len(ins) > 1 and ins[1] is not None):
        axes = attrs.get("axes") or [int(v) for v in ins[1].ints()]
        axes = tuple(x % a.ndim for x in axes)
    else:
        axes = tuple(i for i, d in enumerate(a.shape) if d == 1)
    if any(a.shape[i] != 1 for i in axes):
        raise NotFoldable("squeezing a dim that is not 1: the converter reports it")
    return [Known(a.reshape([d for i, d in enumerate(a.shape) if i not in axes]), ins[0].dtype)]


@folder("Concat")
def _concat(attrs, ins, opset):
    if any(k is None or k.dtype != ins[0].dtype for k in ins):
        raise NotFoldable("mixed dtypes: the converter reports them")
    if not any(k.symbolic for k in ins):
        return [Known(np.concatenate([k.array for k in ins], axis=attrs["axis"]), ins[0].dtype)]
    arrays = [k.array.astype(object) for k in ins]
    return [Known(_obj(np.concatenate(arrays, axis=attrs["axis"])), ins[0].dtype)]


@folder("Split")
def _split(attrs, ins, opset):
    """A symbolic shape vector split into parts of given sizes (ORT's GatherSliceToSplit
    fusion turns Shape -> Gather chains into this)."""
    _need_sym(ins[:1])
    sizes = attrs.get("split")
    if sizes is None and len(ins) > 1 and ins[1] is not None and not ins[1].symbolic:
        sizes = [int(v) for v in ins[1].ints()]
    if sizes is None:
        raise NotFoldable("split sizes come from the output count")
    a = ins[0].array
    axis = attrs.get("axis", 0) % a.ndim
    cuts = np.cumsum(sizes)[:-1]
    return [Known(_obj(p), ins[0].dtype) for p in np.split(a, cuts, axis=axis)]


@folder("Slice")
def _slice(attrs, ins, opset):
    a = ins[0].array
    if opset < 10:
        starts, ends = attrs["starts"], attrs["ends"]
        axes = attrs.get("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        if any(k is not None and k.symbolic for k in ins[1:]):
            raise NotFoldable("symbolic slice bounds")
        starts, ends = [int(v) for v in ins[1].ints()], [int(v) for v in ins[2].ints()]
        axes = [int(v) for v in ins[3].ints()] if len(ins) > 3 and ins[3] is not None else \
            list(range(len(starts)))
        steps = [int(v) for v in ins[4].ints()] if len(ins) > 4 and ins[4] is not None else \
            [1] * len(starts)
    idx = [slice(None)] * a.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps, strict=True):
        if st == 0 or not -a.ndim <= ax < a.ndim:
            raise NotFoldable("bad step / axis: the converter reports it")
        idx[ax % a.ndim] = onnx_slice(a.shape[ax], s, e, st)
    return [Known(_like(a[tuple(idx)], ins[0]), ins[0].dtype)]


@folder("Reshape")
def _reshape(attrs, ins, opset):
    if ins[1].symbolic:
        raise NotFoldable("symbolic target")
    a = ins[0].array
    shape = [int(v) for v in ins[1].ints()]
    shape = [a.shape[i] if d == 0 and not attrs.get("allowzero", 0) else d
             for i, d in enumerate(shape)]
    return [Known(a.reshape(shape), ins[0].dtype)]


@folder("Flatten")
def _flatten(attrs, ins, opset):
    _need_sym(ins)
    a = ins[0].array
    ax = attrs.get("axis", 1) % (a.ndim + 1) if a.ndim else 0
    lead = int(np.prod(a.shape[:ax], dtype=np.int64))
    return [Known(a.reshape(lead, -1), ins[0].dtype)]


def _binary(fn):
    def fold(attrs, ins, opset):
        _need_sym(ins)
        a, b = (k.array for k in ins)
        return [Known(_obj(np.frompyfunc(fn, 2, 1)(a, b)), ins[0].dtype)]

    return fold


def _sym_div(x, y):
    if isinstance(x, SymDim) or isinstance(y, SymDim):
        try:
            return SymDim.of(x) // SymDim.of(y)
        except ValueError:
            pass
        split = _split(x, y)
        if split is None:
            raise NotFoldable(f"{x} / {y} is not exact") from None
        return split[0]  # a size >= 0: ONNX's truncation is the floor
    return int(x) // int(y) if (x >= 0) == (y > 0) else -(-int(x) // int(y))


def _split(x, y) -> tuple[SymDim, int] | None:
    """x = y*q + r of a size x >= 0 for every binding and an int y > 0 that divides x's
    symbolic coefficients ("8*h" by 4 is 2*h rem 0: a Swin window pad), else None."""
    x, y = SymDim.of(x), SymDim.of(y)
    low = x.lower_bound()
    if not y.is_const or y.const < 1 or low is None or low < 0:
        return None
    return x.divmod_int(y.const)


@folder("Mod")
def _mod(attrs, ins, opset):
    """Mod of shape values: a symbolic size by an int it nearly divides is its constant
    remainder (both Mod conventions agree on a size >= 0 and a positive divisor)."""
    _need_sym(ins)

    def one(x, y):
        if not isinstance(x, SymDim) and not isinstance(y, SymDim):
            x, y = int(x), int(y)
            if y == 0:
                raise NotFoldable("Mod by 0")
            return x % y if not attrs.get("fmod", 0) else int(np.fmod(x, y))
        split = _split(x, y)
        if split is None:
            raise NotFoldable(f"{x} mod {y} depends on the binding")
        return split[1]

    a, b = (k.array for k in ins)
    return [Known(_obj(np.frompyfunc(one, 2, 1)(a, b)), ins[0].dtype)]


FOLDERS["Add"] = _binary(lambda x, y: SymDim.of(x) + SymDim.of(y))
FOLDERS["Sub"] = _binary(lambda x, y: SymDim.of(x) - SymDim.of(y))
FOLDERS["Mul"] = _binary(lambda x, y: SymDim.of(x) * SymDim.of(y))
FOLDERS["Div"] = _binary(_sym_div)


def _decide_eq(x, y) -> bool:
    a, b = SymDim.of(x), SymDim.of(y)
    if a == b:
        return True
    if a.known_ne(b):
        return False
    raise NotFoldable(f"cannot decide {a} == {b}")


def _decide_lt(x, y) -> bool:
    d = SymDim.of(y) - SymDim.of(x)  # x < y  <=>  y - x > 0
    if d.is_const:
        return d.const > 0
    lb = d.lower_bound()
    if lb is not None and lb > 0:
        return True
    ub = (-d).lower_bound()
    if ub is not None and ub >= 0:
        return False
    raise NotFoldable(f"cannot decide {x} < {y}")


def _compare(fn):
    def fold(attrs, ins, opset):
        _need_sym(ins)
        a, b = (k.array for k in ins)
        out = np.frompyfunc(fn, 2, 1)(a, b)  # a Python bool for 0-d inputs
        return [Known(np.asarray(out, dtype=object).astype(bool), bool_)]

    return fold


FOLDERS["Equal"] = _compare(_decide_eq)
FOLDERS["Less"] = _compare(_decide_lt)
FOLDERS["Greater"] = _compare(lambda x, y: _decide_lt(y, x))
FOLDERS["LessOrEqual"] = _compare(lambda x, y: not _decide_lt(y, x))
FOLDERS["GreaterOrEqual"] = _compare(lambda x, y: not _decide_lt(x, y))


def _pick(fn):
    def choose(x, y):
        return x if fn(x, y) else y

    return choose


FOLDERS_PICK = {True: _pick(lambda x, y: not _decide_lt(x, y)),   # max of two shape values
                False: _pick(lambda x, y: _decide_lt(x, y) or _decide_eq(x, y))}
FOLDERS["Max"] = _binary(FOLDERS_PICK[True])
FOLDERS["Min"] = _binary(FOLDERS_PICK[False])


@folder("Neg")
def _neg(attrs, ins, opset):
    _need_sym(ins)
    return [Known(_obj(np.frompyfunc(lambda x: -SymDim.of(x), 1, 1)(ins[0].array)), ins[0].dtype)]


@folder("Where")
def _where(attrs, ins, opset):
    _need_sym(ins[1:])
    cond, a, b = ins
    if cond.symbolic:
        raise NotFoldable("symbolic condition")
    return [Known(_obj(np.where(cond.array.astype(bool), a.array.astype(object),
                                b.array.astype(object))), a.dtype)]


@folder("Expand")
def _expand(attrs, ins, opset):
    _need_sym(ins[:1])
    if ins[1].symbolic:
        raise NotFoldable("symbolic target")
    shape = [int(v) for v in ins[1].ints()]
    out = np.broadcast_shapes(ins[0].array.shape, tuple(shape))
    return [Known(np.broadcast_to(ins[0].array, out).copy(), ins[0].dtype)]


_SCATTER_REDUCE = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum,
                   "min": np.minimum}


def scatter_nd(data: np.ndarray, indices: np.ndarray, updates: np.ndarray,
               reduction: str = "none") -> np.ndarray:
    """ONNX ScatterND in NumPy: a copy of `data` with the slices that `indices` names replaced
    by (or combined with) `updates`."""
    if reduction not in _SCATTER_REDUCE:
        raise ValueError(f"ScatterND reduction {reduction!r}; known: {sorted(_SCATTER_REDUCE)}")
    out = np.array(data, copy=True)
    index = np.asarray(indices).astype(np.int64)
    k = index.shape[-1]
    index = index.reshape(-1, k)
    rows = np.asarray(updates).reshape((index.shape[0],) + out.shape[k:])
    combine = _SCATTER_REDUCE[reduction]
    for where, value in zip(map(tuple, index), rows):
        out[where] = value if combine is None else combine(out[where], value)
    return out


@folder("ScatterND")
def _scatter_nd(attrs, ins, opset):
    """ScatterND of compile-time tensors (index tables built from aranges and written into by
    slice assignment, as BEiT's relative position index is); braze has no run-time scatter."""
    if any(k is None or k.symbolic for k in ins):
        raise NotFoldable("symbolic or missing inputs")
    data, idx, upd = ins
    out = scatter_nd(data.array, idx.array, upd.array, attrs.get("reduction", "none"))
    return [Known(out.astype(data.array.dtype), data.dtype)]


@folder("ScatterElements")
def _scatter_elements(attrs, ins, opset):
    """ScatterElements of a shape vector (TorchScript's export of `index_copy` writes the
    index's length into the target's shape); numeric ones go to the generic folder."""
    _need_sym([ins[0], ins[2]])
    data, idx, upd = ins
    if idx.symbolic or attrs.get("reduction", "none") != "none":
        raise NotFoldable("symbolic indices or a reduction")
    axis = attrs.get("axis", 0)
    out = data.array.astype(object)
    i = idx.array.astype(np.int64)
    i = np.where(i < 0, i + out.shape[axis], i)
    np.put_along_axis(out, i, upd.array.astype(object), axis)
    return [Known(_obj(out), data.dtype)]


def numeric(array: np.ndarray, dtype: DType) -> Known:
    return Known(np.asarray(array), dtype)


def scalar_known(v, dtype: DType = i64) -> Known:
    if isinstance(v, SymDim) and not v.is_const:
        return Known(np.array(v, dtype=object), dtype)
    return Known(np.asarray(_norm(v), dtype=dtype.np if dtype != f32 else np.float32), dtype)
