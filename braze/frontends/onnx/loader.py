"""Reading an ONNX model safely: from a path, bytes or a ModelProto, with external data that must
stay inside the model's folder (an untrusted file must not read arbitrary files), and a braze
error naming the file for anything that is not a readable ONNX model."""
from __future__ import annotations

import os
from pathlib import Path

from ...errors import FrontendError

__all__ = ["load_model", "ModelSource"]


class ModelSource:
    """Where a model came from: `label` names it in errors, `folder` anchors external data."""

    def __init__(self, label: str, folder: Path | None):
        self.label = label
        self.folder = folder


def _onnx():
    try:
        import onnx
    except ImportError:
        raise FrontendError("importing ONNX models needs the `onnx` package: "
                            "pip install 'braze[onnx]'") from None
    return onnx


def load_model(model, *, base_dir: str | os.PathLike | None = None):
    """(ModelProto with external data loaded, ModelSource). `model` is a path, bytes or a
    ModelProto; `base_dir` is where external data of bytes / ModelProto inputs lives."""
    onnx = _onnx()
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        proto = model
        src = ModelSource(f"model {proto.graph.name or '<unnamed>'!r}",
                          Path(base_dir) if base_dir is not None else None)
    elif isinstance(model, (bytes, bytearray, memoryview)):
        src = ModelSource("ONNX bytes", Path(base_dir) if base_dir is not None else None)
        proto = _parse(onnx, bytes(model), src.label, DecodeError)
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        src = ModelSource(str(path), path.resolve().parent)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise FrontendError(f"cannot read ONNX model {path}: {e.strerror or e}") from None
        proto = _parse(onnx, data, str(path), DecodeError)
    else:
        raise FrontendError(f"import_onnx takes a path, bytes or an onnx.ModelProto, got "
                            f"{type(model).__name__}")
    if not proto.HasField("graph"):
        raise FrontendError(f"{src.label} is not an ONNX model: it has no graph")
    _load_external_data(onnx, proto, src)
    return proto, src


def _parse(onnx, data: bytes, label: str, decode_error):
    if not data:
        raise FrontendError(f"{label} is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (decode_error, ValueError, RuntimeError) as e:
        raise FrontendError(f"{label} is not a valid ONNX model (truncated or not ONNX "
                            f"protobuf: {e})") from None
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise FrontendError(f"{label} is not an ONNX model (no graph nodes or outputs; "
                            "truncated or a different file format?)")
    return proto


def _external_tensors(proto):
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return [t for t in _get_all_tensors(proto) if uses_external_data(t)]


def _load_external_data(onnx, proto, src: ModelSource) -> None:
    """Check every external-data location stays inside the model folder, then load it."""
    tensors = _external_tensors(proto)
    if not tensors:
        return
    if src.folder is None:
        raise FrontendError(f"{src.label} stores tensors as external data; pass the model's "
                            "path, or base_dir= naming the folder that holds the data files")
    root = src.folder.resolve()
    for t in tensors:
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if not loc:
            raise FrontendError(f"{src.label}: tensor {t.name!r} uses external data without a "
                                "location")
        p = Path(loc)
        if p.is_absolute() or ".." in p.parts or loc.startswith(("/", "\\")) or ":" in loc:
            raise FrontendError(f"{src.label}: tensor {t.name!r} points its external data at "
                                f"{loc!r}, outside the model's folder; braze only reads data "
                                "files next to the model (refusing, an untrusted model must not "
                                "read arbitrary files)")
        full = (root / p).resolve()
        if root not in full.parents and full != root:
            raise FrontendError(f"{src.label}: external data {loc!r} of tensor {t.name!r} "
                                "resolves outside the model's folder (through a link?); refusing")
        if not full.is_file():
            raise FrontendError(f"{src.label}: external data file {loc!r} of tensor {t.name!r} "
                                f"is missing from {root}")
    from onnx.external_data_helper import load_external_data_for_model

    try:
        load_external_data_for_model(proto, str(root))
    except Exception as e:  # noqa: BLE001 - any read failure is a bad model file
        raise FrontendError(f"{src.label}: cannot read external data: {type(e).__name__}: "
                            f"{e}") from None
