"""Files named by a user are read only when they are regular files: a FIFO given as a model or
saved graph had blocked `open` forever, and a device such as /dev/zero was read until memory ran
out; both are now a braze error naming the file (found by a hostile-file sweep)."""
from __future__ import annotations

import os
import threading

import pytest

import braze as bz
from braze.ir.files import open_regular


def _without_hanging(fn, fifo):
    """fn()'s exception; fails (unblocking the reader) if fn is still blocked after 10 s."""
    box = {}

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the blocked open return
        t.join(10)
        pytest.fail(f"reading the FIFO {fifo} blocked")
    return box.get("error")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("ext", [".onnx", ".json"])
def test_a_fifo_is_refused_not_waited_on(tmp_path, ext):
    pytest.importorskip("onnx")
    fifo = str(tmp_path / f"model{ext}")
    os.mkfifo(fifo)
    read = bz.import_onnx if ext == ".onnx" else bz.load
    err = _without_hanging(lambda: read(fifo), fifo)
    assert isinstance(err, bz.BrazeError), err
    assert "model" + ext in str(err) and "not a regular file" in str(err)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused_before_reading(tmp_path):
    with pytest.raises(OSError, match="not a regular file"):
        open_regular("/dev/zero")
    with pytest.raises(IsADirectoryError):
        open_regular(tmp_path)
    (tmp_path / "f.txt").write_text("ok")
    with open_regular(tmp_path / "f.txt", "r", encoding="utf-8") as f:
        assert f.read() == "ok"
    with pytest.raises(bz.ParseError, match="/dev/zero.*not a regular file"):
        bz.load("/dev/zero")
