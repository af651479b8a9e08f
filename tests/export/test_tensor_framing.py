"""write_tensor_message: the exporter frames each inline initializer itself (protobuf writes
only the tensor's header) and writes the weight bytes from the array; the bytes must be exactly
what protobuf serializes for the same tensor, for every dtype and layout."""
import io

import ml_dtypes
import numpy as np
import onnx
import pytest

from braze.export.onnx.builder import fill_tensor, write_tensor_message

RNG = np.random.default_rng(0)
ARRAYS = {
    "f32": RNG.standard_normal((3, 4)).astype(np.float32),
    "f32_large": RNG.standard_normal(70_000).astype(np.float32),  # multi-byte length varints
    "i64": np.arange(300, dtype=np.int64).reshape(10, 30),
    "bf16": RNG.standard_normal(5).astype(ml_dtypes.bfloat16),
    "f16_transposed": RNG.standard_normal((4, 6)).astype(np.float16).T,  # not contiguous
    "bool_scalar": np.array(True),
    "empty": np.zeros((0, 3), np.float32),
    "c64": (RNG.standard_normal(3) + 1j).astype(np.complex64),
}


@pytest.mark.parametrize("key", sorted(ARRAYS))
def test_framed_tensor_equals_protobufs_serialization(key):
    arr = ARRAYS[key]
    framed = io.BytesIO()
    write_tensor_message(framed, "layer.0.weight", arr)
    ref = onnx.ModelProto()
    fill_tensor(ref.graph.initializer.add(), "layer.0.weight", arr)
    assert framed.getvalue() == ref.SerializeToString()


def test_framed_tensors_concatenate_into_one_model():
    out = io.BytesIO()
    for i, key in enumerate(sorted(ARRAYS)):
        write_tensor_message(out, f"t{i}", ARRAYS[key])
    m = onnx.ModelProto.FromString(out.getvalue())
    assert [t.name for t in m.graph.initializer] == [f"t{i}" for i in range(len(ARRAYS))]
    for t, key in zip(m.graph.initializer, sorted(ARRAYS)):
        got = onnx.numpy_helper.to_array(t)
        want = ARRAYS[key]
        if want.dtype == ml_dtypes.bfloat16:
            got = got.astype(np.float32)
            want = want.astype(np.float32)
        np.testing.assert_array_equal(got, want)
