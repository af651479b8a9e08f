"""Shared fixtures. `hf_zoo` exports Hugging Face models (random weights, see braze.models.hf) to
ONNX once per test session, shared by the xdist workers through a file lock on a common folder;
set BRAZE_TEST_CACHE=/some/dir to keep the exports across sessions. `hf_vision_zoo` does the
same for the vision families of braze.models.hf_vision."""
from __future__ import annotations

import fcntl
import functools
import os
import tempfile
from pathlib import Path

import pytest

# GEMM choices measured while the suite runs (xdist workers on a busy machine) go to a file of
# their own, not the user's kernel cache, where a wrong winner would be kept for good
# (braze/runtime/kernels/gemm_choice.py)
os.environ.setdefault("BRAZE_GEMM_CHOICES", os.path.join(
    tempfile.gettempdir(), f"braze-tests-{os.getuid()}-gemm_choice.json"))


def _cached_export(folder: Path, stem: str, export) -> str:
    """`folder/stem.onnx`, written once by `export(path)` under a file lock (xdist workers
    share the folder)."""
    path = folder / f"{stem}.onnx"
    with open(folder / f".{stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            tmp = path.with_suffix(".partial.onnx")
            export(tmp)
            os.replace(tmp, path)
    return str(path)


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

        def export(tmp):  # builds the module only when the file is missing
            module = self.module(family, variant_attn(family, variant))
            export_onnx_variant(module, tmp, variant)

        return _cached_export(self.folder, f"{family}_{variant}", export)

    @functools.cache  # noqa: B019
    def graph(self, family: str, variant: str):
        import braze as bz

        return bz.import_onnx(self.onnx(family, variant))


class HFVisionZoo:
    """Cached vision modules and ONNX exports: `zoo.module(family)`, `zoo.onnx(family,
    variant)` (a path; variant "torchscript" or "dynamo")."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)

    @functools.cache  # noqa: B019 - one zoo per session
    def module(self, family: str):
        from braze.models.hf_vision import hf_vision_module

        return hf_vision_module(family)

    def onnx(self, family: str, variant: str) -> str:
        from braze.models.hf_vision import export_vision_onnx

        return _cached_export(self.folder, f"{family}_{variant}",
                              lambda tmp: export_vision_onnx(self.module(family), tmp, variant))


def _export_folder(tmp_path_factory, name: str) -> Path:
    env = os.environ.get("BRAZE_TEST_CACHE")
    if env:
        return Path(env) / name
    return tmp_path_factory.getbasetemp().parent / name  # shared by every xdist worker


@pytest.fixture(scope="session")
def hf_zoo(tmp_path_factory) -> HFZoo:
    return HFZoo(_export_folder(tmp_path_factory, "hf_exports"))


@pytest.fixture(scope="session")
def hf_vision_zoo(tmp_path_factory) -> HFVisionZoo:
    return HFVisionZoo(_export_folder(tmp_path_factory, "hf_vision_exports"))
