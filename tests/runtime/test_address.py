"""runtime/address.py: the data address every native kernel call passes to C, read from the
array object instead of through `ndarray.ctypes` (~8x faster). It must equal `.ctypes.data`
for every kind of array a kernel can be handed."""
import numpy as np
import pytest

from braze.runtime import address as addr


def _arrays():
    base = np.arange(2 * 3 * 40, dtype=np.float32).reshape(2, 3, 40)
    yield "contiguous", base
    yield "view at an offset", base[1, 1:, 7:]
    yield "transposed", base.T
    yield "reshaped view", base.reshape(6, 40)[3:]
    yield "fortran order", np.asfortranarray(base[0])
    yield "0-d", np.full((), 3.0, np.float32)
    yield "empty", np.empty((0, 5), np.float32)
    yield "broadcast (zero strides)", np.broadcast_to(base[0, 0], (4, 40))
    yield "uint16", np.ones((3, 7), np.uint16)[1:]
    yield "int64", np.arange(9, dtype=np.int64)[::2]
    yield "memmap-like subclass", np.arange(6, dtype=np.float32).view(np.recarray)


@pytest.mark.parametrize("name, a", list(_arrays()), ids=[n for n, _ in _arrays()])
def test_address_is_the_data_pointer(name, a):
    assert addr.address(a) == a.ctypes.data


def test_the_fast_read_is_confirmed_under_cpython():
    import sys

    if sys.implementation.name == "cpython":
        assert addr._OFFSET is not None


def test_without_a_confirmed_offset_it_falls_back(monkeypatch):
    monkeypatch.setattr(addr, "_OFFSET", None)
    a = np.arange(10, dtype=np.float32)[3:]
    assert addr.address(a) == a.ctypes.data


def test_a_non_array_is_refused_not_read():
    with pytest.raises(AttributeError):
        addr.address([1.0, 2.0])
