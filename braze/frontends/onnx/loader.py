"""Reading an ONNX model safely and without copying its weights: from a path, bytes or a
ModelProto, with external data that must stay inside the model's folder (an untrusted file must
not read arbitrary files), and a braze error naming the file for anything that is not a readable
ONNX model.

The file is read once (memory-mapped when large, see `read_file`). Protobuf parses only a
skeleton of it (wire.py strips the initializers' raw_data); each initializer's bytes are a view
of the file's bytes (`LoadedModel.payloads`), and external data files are read once each and
viewed the same way."""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import FrontendError
from ...ir.files import open_regular
from .wire import split_raw_data

__all__ = ["load_model", "read_file", "proto_str", "ModelSource", "LoadedModel", "MMAP_BYTES"]

MMAP_BYTES = 64 << 20  # files this big are memory-mapped rather than read (see read_file)


class ModelSource:
    """Where a model came from: `label` names it in errors, `folder` anchors external data."""

    def __init__(self, label: str, folder: Path | None):
        self.label = label
        self.folder = folder


@dataclass
class LoadedModel:
    """A parsed model: `payloads[i]` holds the bytes of graph initializer i (a zero-copy view of
    the file or of its external data file), or None when the tensor proto holds its data."""

    proto: object
    source: ModelSource
    payloads: list[memoryview | None] = field(default_factory=list)


def _onnx():
    try:
        import onnx
    except ImportError:
        raise FrontendError("importing ONNX models needs the `onnx` package: "
                            "pip install 'braze[onnx]'") from None
    return onnx


def load_model(model, *, base_dir: str | os.PathLike | None = None,
               use_mmap: bool | None = None) -> LoadedModel:
    """The parsed model with its weights' bytes. `model` is a path, bytes or a ModelProto;
    `base_dir` is where external data of bytes / ModelProto inputs lives; `use_mmap` see
    `read_file`."""
    onnx = _onnx()
    payloads: list[memoryview | None] = []
    if isinstance(model, onnx.ModelProto):
        proto = model
        src = ModelSource(f"model {proto.graph.name or '<unnamed>'!r}",
                          Path(base_dir) if base_dir is not None else None)
    elif isinstance(model, (bytes, bytearray, memoryview)):
        src = ModelSource("ONNX bytes", Path(base_dir) if base_dir is not None else None)
        proto, payloads = _parse(onnx, bytes(model), src.label)
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        try:
            data = read_file(path, use_mmap)
            folder = path.resolve().parent
        except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop, from resolve()
            raise FrontendError(f"cannot read ONNX model {path}: {_why(e)}") from None
        except ValueError as e:  # a NUL in the path
            raise FrontendError(f"cannot read ONNX model {path!r}: {e}") from None
        src = ModelSource(str(path), folder)
        proto, payloads = _parse(onnx, data, str(path))
    else:
        raise FrontendError(f"import_onnx takes a path, bytes or an onnx.ModelProto, got "
                            f"{type(model).__name__}")
    if not proto.HasField("graph"):
        raise FrontendError(f"{src.label} is not an ONNX model: it has no graph")
    loaded = LoadedModel(proto, src, payloads or [None] * len(proto.graph.initializer))
    if len(loaded.payloads) != len(proto.graph.initializer):
        raise FrontendError(f"{src.label} is not a valid ONNX model (its initializers could not "
                            "be read consistently; truncated?)")
    _load_external_data(loaded, use_mmap)
    return loaded


def proto_str(s) -> str:
    """A proto string field as str (protobuf hands back bytes for invalid UTF-8): every name
    the importer reads goes through it, so a node reading a name matches its producer."""
    return s if isinstance(s, str) else s.decode("utf-8", "replace")


def _why(e: Exception) -> str:
    """What an OSError / resolve() failure says, without its errno prefix."""
    return getattr(e, "strerror", None) or str(e)


def read_file(path: Path, use_mmap: bool | None = None):
    """The bytes of `path`: memory-mapped (read-only, nothing copied) when `use_mmap` is True,
    or when it is None and the file has at least MMAP_BYTES; read into memory otherwise.
    Weights viewed in a mapped file change if the file is rewritten in place while the graph
    lives (and reading a truncated mapping kills the process): write a new file and rename it
    over the old one, or import with use_mmap=False."""
    with open_regular(path) as f:  # a FIFO or device is refused, not read forever
        size = os.fstat(f.fileno()).st_size
        if size and (use_mmap or (use_mmap is None and size >= MMAP_BYTES)):
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return f.read()


def _parse(onnx, data: bytes, label: str):
    """(ModelProto, payload views): the skeleton parsed by protobuf, the weights viewed."""
    from google.protobuf.message import DecodeError

    if not len(data):
        raise FrontendError(f"{label} is empty, not an ONNX model")
    split = split_raw_data(data)
    skeleton, places = split if split is not None else (bytes(data), [])
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(skeleton)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise FrontendError(f"{label} is not a valid ONNX model (truncated or not ONNX "
                            f"protobuf: {e})") from None
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise FrontendError(f"{label} is not an ONNX model (no graph nodes or outputs; "
                            "truncated or a different file format?)")
    view = memoryview(data)
    payloads = [None if p is None else view[p[0]:p[0] + p[1]] for p in places]
    return proto, payloads


def _load_external_data(loaded: LoadedModel, use_mmap: bool | None) -> None:
    """Check every external-data location stays inside the model folder, then view (graph
    initializers) or load (tensors in attributes) its bytes; each data file is read once."""
    from onnx.external_data_helper import _get_attribute_tensors, uses_external_data

    proto, src = loaded.proto, loaded.source
    inits = [(i, t) for i, t in enumerate(proto.graph.initializer) if uses_external_data(t)]
    attrs = [t for t in _get_attribute_tensors(proto) if uses_external_data(t)]
    if not inits and not attrs:
        return
    if src.folder is None:
        raise FrontendError(f"{src.label} stores tensors as external data; pass the model's "
                            "path, or base_dir= naming the folder that holds the data files")
    try:
        root = src.folder.resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symlink loop, a NUL
        raise FrontendError(f"{src.label}: cannot use {str(src.folder)!r} as the folder of its "
                            f"external data: {_why(e)}") from None
    files: dict[Path, memoryview] = {}
    for i, t in inits:
        loaded.payloads[i] = _external_bytes(src, root, t, files, use_mmap)
    for t in attrs:  # a tensor inside a node attribute (Constant): give it its bytes
        t.raw_data = bytes(_external_bytes(src, root, t, files, use_mmap))
        t.data_location = t.DEFAULT
        del t.external_data[:]


def _external_bytes(src: ModelSource, root: Path, t, files: dict[Path, memoryview],
                    use_mmap: bool | None) -> memoryview:
    info = {proto_str(e.key): proto_str(e.value) for e in t.external_data}
    loc = info.get("location", "")
    if not loc:
        raise FrontendError(f"{src.label}: tensor {t.name!r} uses external data without a "
                            "location")
    p = Path(loc)
    if "\0" in loc:
        raise FrontendError(f"{src.label}: tensor {t.name!r} has an external data location "
                            f"with a NUL byte ({loc!r}); the model is corrupt")
    if p.is_absolute() or ".." in p.parts or loc.startswith(("/", "\\")) or ":" in loc:
        raise FrontendError(f"{src.label}: tensor {t.name!r} points its external data at "
                            f"{loc!r}, outside the model's folder; braze only reads data "
                            "files next to the model (refusing, an untrusted model must not "
                            "read arbitrary files)")
    try:
        full = (root / p).resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop
        raise FrontendError(f"{src.label}: cannot read external data {loc!r} of tensor "
                            f"{t.name!r}: {_why(e)}") from None
    if root not in full.parents and full != root:
        raise FrontendError(f"{src.label}: external data {loc!r} of tensor {t.name!r} "
                            "resolves outside the model's folder (through a link?); refusing")
    if full not in files:
        if not full.is_file():
            raise FrontendError(f"{src.label}: external data file {loc!r} of tensor "
                                f"{t.name!r} is missing from {root}")
        try:
            files[full] = memoryview(read_file(full, use_mmap))
        except OSError as e:
            raise FrontendError(f"{src.label}: cannot read external data {loc!r}: "
                                f"{_why(e)}") from None
    data = files[full]
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else len(data) - offset
    except ValueError:
        raise FrontendError(f"{src.label}: tensor {t.name!r} has a malformed external data "
                            f"offset / length ({info})") from None
    if offset < 0 or length < 0 or offset + length > len(data):
        raise FrontendError(f"{src.label}: tensor {t.name!r} reads bytes {offset}.."
                            f"{offset + length} of {loc!r}, which has {len(data)} bytes "
                            "(truncated data file?)")
    return data[offset:offset + length]
