"""Every C kernel library builds where its CPU features are present. A library whose source
the compiler rejects loads as None and its kernels quietly fall back (other paths, NumPy), and
the tests of a missing library skip: without this check a compile error would read as a green
suite. (A generated `_packed` wrapper for a `(argtypes, restype)` signature once disabled the
whole NHWC f32 conv that way.)"""
import importlib

import pytest

from braze.runtime.codegen import cc

# module -> (its library function, the CPU flags it needs)
LIBRARIES = {
    "native": ("lib", ()),
    "attention_native": ("lib", ()),
    "conv_native": ("lib", ()),
    "conv_tiles": ("lib", ()),
    "packed_gemm": ("lib", ()),
    "transpose": ("lib", ()),
    "nhwc_ops": ("lib", ()),
    "elementwise_c": ("lib", ()),
    "quant": ("lib", ()),
    "indexing": ("lib", ()),
    "selection": ("lib", ()),
    "rope_layouts": ("lib", ()),
    "bf16_batched": ("_lib", ()),
    "bf16_gemm": ("_lib", ()),
    "conv_nhwc": ("lib", ("avx512f",)),
    "dpbf16_gemm": ("_lib", ("avx512_bf16",)),
    "int8_gemm": ("_lib", ("avx512_vnni",)),
    "conv_dp": ("lib", ("avx512_bf16",)),
    "attention_dp": ("_lib", ("avx512_bf16",)),
}


@pytest.mark.skipif(not cc.available(), reason="no C compiler here")
@pytest.mark.parametrize("module", sorted(LIBRARIES))
def test_the_library_builds_where_its_cpu_features_are(module):
    fn, flags = LIBRARIES[module]
    missing = set(flags) - cc.cpu_flags()
    if missing:
        pytest.skip(f"needs {', '.join(sorted(missing))}")
    mod = importlib.import_module(f"braze.runtime.kernels.{module}")
    assert getattr(mod, fn)() is not None, f"{module}'s C library did not build"
