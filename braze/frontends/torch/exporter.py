"""`import_torch`: a PyTorch module (through torch.export), a saved `.pt2` program or an
ExportedProgram to a braze Graph.

The driver exports with `torch.export.export(strict=False)` (falling back to strict tracing when
non-strict fails for a reason other than the user's dynamic shapes), runs torch's decompositions
minus braze's native ops (decompositions.py), and hands the program to the importer. torch's
failures become one FrontendError with the first lines of torch's message and a hint, never a
deep traceback."""
from __future__ import annotations

import inspect
import logging
import os
import warnings
from collections.abc import Mapping

from ...errors import FrontendError
from ...ir.graph import Graph
from .decompositions import decomposition_table, detach_no_grad_regions
from .importer import import_program
from .symbolic import torch_dynamic_shapes

__all__ = ["import_torch", "export_program"]

_MESSAGE_LINES = 6


def import_torch(model, example_inputs=None, dynamic_shapes=None, *, strict: bool | None = None,
                 name: str | None = None) -> Graph:
    """Import a PyTorch model as a braze Graph.

    `model` is an nn.Module (exported here with `example_inputs`: a tuple of positional
    arguments, a dict of keyword arguments, or one tensor; NumPy arrays are accepted), an
    ExportedProgram, or the path of one saved with torch.export.save (.pt2).

    `dynamic_shapes` marks dynamic dims: torch.export's own form (torch.export.Dim objects), or
    braze's {input name: {axis: "name"}} (or {input: ("batch", "seq")}), where torch infers the
    ranges and the names become the braze dims ("batch", "seq", "batch*seq"). For a saved
    program it only names the dims torch made dynamic. Unnamed dynamic dims are called
    `<input>_dim<axis>`. `strict` forces torch.export's strict (True) or non-strict (False)
    tracing; by default non-strict, then strict if that fails.

    Call `module.eval()` first: dropout and batch statistics of training mode are refused.
    Raises FrontendError when torch.export fails (torch's message and a hint) and
    UnsupportedOpsError listing every ATen op braze cannot import, each with a module path."""
    ep, labels, label = export_program(model, example_inputs, dynamic_shapes, strict=strict)
    ep = _decompose(ep, label)
    return import_program(ep, labels=labels, label=label, name=name or _graph_name(model))


def _graph_name(model) -> str:
    if isinstance(model, (str, os.PathLike)):
        return os.path.splitext(os.path.basename(os.fspath(model)))[0] or "torch_model"
    cls = type(model).__name__
    return "torch_model" if cls == "ExportedProgram" else cls


def export_program(model, example_inputs=None, dynamic_shapes=None, *,
                   strict: bool | None = None):
    """(ExportedProgram, dim labels, source label) for any model `import_torch` accepts."""
    import torch

    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise FrontendError(f"{path}: no such file (expected a program saved with "
                                "torch.export.save, usually .pt2)")
        quiet = logging.getLogger("torch.export")  # it logs a traceback before it raises
        level = quiet.level
        try:
            quiet.setLevel(logging.CRITICAL)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ep = torch.export.load(path)
        except Exception as e:  # noqa: BLE001 - any load failure is a bad file
            raise FrontendError(f"{path}: torch.export.load failed: {_first_lines(e)}") from None
        finally:
            quiet.setLevel(level)
        return ep, _program_labels(ep, dynamic_shapes, path), os.path.basename(path)
    if isinstance(model, torch.export.ExportedProgram):
        return model, _program_labels(model, dynamic_shapes, "program"), "program"
    if not isinstance(model, torch.nn.Module):
        raise FrontendError(f"import_torch takes an nn.Module, an ExportedProgram or a .pt2 "
                            f"path, got {type(model).__name__}")
    label = type(model).__name__
    args, kwargs = _example(example_inputs, label)
    bound = _bound_args(model, args, kwargs)
    arg_names = list(bound)
    spec, labels = torch_dynamic_shapes(dynamic_shapes, arg_names)
    _check_multiple_examples(dynamic_shapes, bound, label)
    if isinstance(spec, dict):
        spec = {k: spec.get(k) for k in arg_names}
    return _export(model, args, kwargs, spec, strict, label), labels, label


def _example(example_inputs, label: str):
    import numpy as np
    import torch

    def tensor(x):
        return torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x

    if example_inputs is None:
        raise FrontendError(f"{label}: import_torch needs example_inputs to export a module "
                            "(a tuple of arguments, a dict of keyword arguments or a tensor)")
    if isinstance(example_inputs, Mapping):
        return (), {k: tensor(v) for k, v in example_inputs.items()}
    if isinstance(example_inputs, (tuple, list)):
        return tuple(tensor(x) for x in example_inputs), {}
    return (tensor(example_inputs),), {}


def _bound_args(model, args, kwargs) -> dict:
    """forward's parameter name -> example value."""
    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as e:
        raise FrontendError(f"{type(model).__name__}.forward does not accept the example "
                            f"inputs: {e}") from None
    return dict(bound.arguments)


def _check_multiple_examples(dynamic_shapes, bound: dict, label: str) -> None:
    """A dim named a multiple ("32*h") needs an example size of that multiple of a whole number
    >= 2: torch.export treats a root of 0 or 1 as static and then reports a violated
    constraint, which reads like the model's fault."""
    if not isinstance(dynamic_shapes, Mapping):
        return
    for name, axes in dynamic_shapes.items():
        t = bound.get(name)
        items = axes.items() if isinstance(axes, Mapping) else \
            enumerate(axes) if isinstance(axes, (tuple, list)) else ()
        for axis, d in items:
            if not isinstance(d, str):
                continue
            coef, _, root = d.replace(" ", "").rpartition("*")
            if not coef.isdigit() or int(coef) < 1 or int(axis) >= len(getattr(t, "shape", ())):
                continue
            k, size = int(coef), int(t.shape[int(axis)])
            if size % k == 0 and size // k >= 2:
                continue
            why = (f"not a multiple of {k}" if size % k else
                   f"which makes {root} = {size // k} (torch.export treats 0 and 1 as static)")
            raise FrontendError(
                f"{label}: dim {axis} of input {name!r} was named {d!r} but the example's size "
                f"there is {size}, {why}; export with an example size of {k} times a whole "
                f"number >= 2 (e.g. {2 * k})")


def _program_labels(ep, dynamic_shapes, label: str) -> dict:
    if dynamic_shapes is None:
        return {}
    from .importer import _user_inputs

    names = [n.name for n in _user_inputs(ep)]
    try:
        _, labels = torch_dynamic_shapes(dynamic_shapes, names)
    except FrontendError as e:
        raise FrontendError(f"{label}: {e}") from None
    return labels


def _export(model, args, kwargs, spec, strict: bool | None, label: str):
    import torch

    modes = [False, True] if strict is None else [bool(strict)]
    errors = []
    for mode in modes:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return torch.export.export(model, args, kwargs or None, dynamic_shapes=spec,
                                           strict=mode)
        except Exception as e:  # noqa: BLE001 - torch raises many types; all are reported
            errors.append((mode, e))
            if _about_shapes(e):
                break
    raise _export_error(label, errors) from None


def _about_shapes(e: Exception) -> bool:
    """A failure about the user's dynamic_shapes (strict tracing would fail the same way)."""
    text = str(e)
    return any(k in text for k in ("Constraints violated", "dynamic_shapes",
                                   "specialized", "Dim("))


def _first_lines(e: Exception, n: int = _MESSAGE_LINES) -> str:
    lines = [ln.rstrip() for ln in str(e).strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.lstrip().startswith(("File \"", "Traceback"))]
    text = "\n  ".join(lines[:n]) or type(e).__name__
    return f"{type(e).__name__}: {text}"


def _export_error(label: str, errors: list) -> FrontendError:
    mode, first = errors[0]
    text = str(first)
    if "Constraints violated" in text or "specialized" in text:
        hint = ("a dim you marked dynamic is constrained by the model's code: apply torch's "
                "suggested fix above (e.g. Dim('seq', max=...)), or name the dims with braze's "
                "form {input: {axis: 'name'}}, which lets torch infer the ranges")
    elif "data-dependent" in text.lower() or "GuardOnDataDependent" in type(first).__name__:
        hint = ("the model branches on tensor values; braze imports graphs whose control flow "
                "depends on shapes only: make the branch depend on shapes, or on a constant")
    elif "pytree" in text or "not a known type" in text:
        hint = ("the model takes or returns a type torch.export cannot flatten (a cache "
                "object?): wrap the module so it takes and returns tensors (e.g. pass "
                "use_cache=False and return .last_hidden_state)")
    else:
        hint = ("run torch.export.export(module, args, strict=False) yourself for the full "
                "error, or torch.export.draft_export for a report of every issue")
    msg = f"{label}: torch.export failed ({'strict' if mode else 'non-strict'}): " \
          f"{_first_lines(first)}"
    if len(errors) > 1:
        msg += f"\n  strict tracing failed too: {_first_lines(errors[1][1], 2)}"
    return FrontendError(f"{msg}\nhint: {hint}")


def _decompose(ep, label: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return detach_no_grad_regions(ep).run_decompositions(decomposition_table())
    except Exception as e:  # noqa: BLE001 - reported with torch's message
        raise FrontendError(f"{label}: torch's decompositions failed: {_first_lines(e)}\nhint: "
                            "the program may use an op without a functional form; export it "
                            "with strict=False") from None
