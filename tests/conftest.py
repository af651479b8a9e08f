"""Shared fixtures. `hf_zoo` exports Hugging Face models (random weights, see braze.models.hf) to
ONNX once per test session, shared by the xdist workers through a file lock on a common folder;
set BRAZE_TEST_CACHE=/some/dir to keep the exports across sessions."""
from __future__ import annotations

import fcntl
import functools
import os
from pathlib import Path

import pytest


class HFZoo:
    """Cached HF modules and ONNX exports: `zoo.module(family, attn)`, `zoo.onnx(family,
    variant)` (a path), `zoo.graph(family, variant)` (imported once per worker)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)

    @functools.cache  # noqa: B019 - one zoo per session
    def module(self, family: str, attn: str = "sdpa"):
        from braze.models.hf import hf_module

        return hf_module(family, attn=attn)

    def onnx(self, family: str, variant: str) -> str:
        from braze.models.hf import export_onnx_variant, variant_attn

        path = self.folder / f"{family}_{variant}.onnx"
        with open(self.folder / f".{family}_{variant}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                tmp = path.with_suffix(".partial.onnx")
                export_onnx_variant(self.module(family, variant_attn(family, variant)), tmp,
                                    variant)
                os.replace(tmp, path)
        return str(path)

    @functools.cache  # noqa: B019
    def graph(self, family: str, variant: str):
        import braze as bz

        return bz.import_onnx(self.onnx(family, variant))


@pytest.fixture(scope="session")
def hf_zoo(tmp_path_factory) -> HFZoo:
    env = os.environ.get("BRAZE_TEST_CACHE")
    if env:
        folder = Path(env) / "hf_exports"
    else:  # shared by every xdist worker of this run
        folder = tmp_path_factory.getbasetemp().parent / "hf_exports"
    return HFZoo(folder)
