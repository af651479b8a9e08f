"""Zero-copy weights: split a serialized ModelProto into a small skeleton (the model without the
`raw_data` payloads of its graph initializers) and the payloads' places in the original bytes.

Parsing a 400 MB model with protobuf copies every weight into protobuf's memory, and reading
`tensor.raw_data` copies it again; parsing only the skeleton and viewing each payload in the
file's bytes (`np.frombuffer(data, offset=...)`) copies nothing. The scan reads the protobuf wire
format (tag varints, length-delimited fields) of ModelProto.graph (field 7), GraphProto
.initializer (field 5) and TensorProto.raw_data (field 9) only, and gives up (returns None; the
caller then parses the bytes the ordinary way) on anything it does not expect: a malformed
model is reported by protobuf's parser, never by this scan."""
from __future__ import annotations

__all__ = ["split_raw_data", "Payload", "encode_varint"]

_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_RAW_DATA = 9
_LEN = 2

Payload = tuple[int, int]  # (offset, length) in the original bytes


class _Unexpected(Exception):
    pass


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Unexpected
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def encode_varint(n: int) -> bytes:
    """`n` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf, start: int, end: int):
    """(field number, wire type, field start, payload start, payload end) of each field."""
    pos = start
    while pos < end:
        begin = pos
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Unexpected
        if wire == 0:
            _, pos = _varint(buf, pos, end)
            yield number, wire, begin, pos, pos
        elif wire == 1:
            pos += 8
            yield number, wire, begin, pos - 8, pos
        elif wire == _LEN:
            n, pos = _varint(buf, pos, end)
            yield number, wire, begin, pos, pos + n
            pos += n
        elif wire == 5:
            pos += 4
            yield number, wire, begin, pos - 4, pos
        else:  # groups (3, 4) or invalid
            raise _Unexpected
        if pos > end:
            raise _Unexpected


def _strip_tensor(buf, start: int, end: int) -> tuple[bytes, Payload | None]:
    """The TensorProto bytes without raw_data, and the raw_data payload's place."""
    payload = None
    parts = []
    keep_from = start
    for number, wire, begin, p0, p1 in _fields(buf, start, end):
        if number == _TENSOR_RAW_DATA:
            if wire != _LEN or payload is not None:
                raise _Unexpected  # a repeated raw_data merges: leave it to protobuf
            payload = (p0, p1 - p0)
            parts.append(buf[keep_from:begin])
            keep_from = p1
    parts.append(buf[keep_from:end])
    return b"".join(parts), payload


def _strip_graph(buf, start: int, end: int) -> tuple[bytes, list[Payload | None]]:
    parts = []
    payloads: list[Payload | None] = []
    keep_from = start
    for number, wire, begin, p0, p1 in _fields(buf, start, end):
        if number != _GRAPH_INITIALIZER:
            continue
        if wire != _LEN:
            raise _Unexpected
        tensor, payload = _strip_tensor(buf, p0, p1)
        payloads.append(payload)
        if payload is None:
            continue  # kept as it is
        parts.append(buf[keep_from:begin])
        parts.append(encode_varint((_GRAPH_INITIALIZER << 3) | _LEN))
        parts.append(encode_varint(len(tensor)))
        parts.append(tensor)
        keep_from = p1
    parts.append(buf[keep_from:end])
    return b"".join(parts), payloads


def split_raw_data(data: bytes) -> tuple[bytes, list[Payload | None]] | None:
    """(skeleton bytes, payload place per graph initializer in order, None where it has no
    raw_data), or None when `data` is not laid out as expected."""
    buf = memoryview(data)
    try:
        graph = None
        for number, wire, begin, p0, p1 in _fields(buf, 0, len(buf)):
            if number == _MODEL_GRAPH:
                if wire != _LEN or graph is not None:
                    return None  # a repeated graph field merges: leave it to protobuf
                graph = (begin, p0, p1)
        if graph is None:
            return None
        begin, p0, p1 = graph
        body, payloads = _strip_graph(buf, p0, p1)
    except (_Unexpected, IndexError):
        return None
    if not any(payloads):
        return None
    skeleton = b"".join([buf[:begin], encode_varint((_MODEL_GRAPH << 3) | _LEN),
                         encode_varint(len(body)), body, buf[p1:]])
    return skeleton, payloads
