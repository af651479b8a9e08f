"""Which fp32 GEMM runs a static weight of a given shape on this machine: braze's packed-weight
kernel (packed_gemm.py) or MKL's sgemm in tiles with the C epilogue (fused.gemm_bias_act),
measured once per weight shape and machine, and remembered in the kernel cache.

The two trade places by CPU: on the AVX2 EPYC VM of earlier sessions the packed kernel took
0.80-0.86x the MKL tiles' time end to end; on the AMX / AVX-512 Xeon VM of 2026-11-27 MKL
won (BERT-base sdpa b1: 152 ms median with MKL tiles against 176 packed, in one process,
alternating). So neither is a fixed default: the first time a shape is seen, each runs a
128-row product a few times (best of 5, alternating) and the faster is recorded in
`$BRAZE_CACHE_DIR/gemm_choice_<machine>.json`. `BRAZE_PACKED_GEMM=1` / `0` force one."""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable

import numpy as np

from ..codegen import cc
from . import blas, native
from . import packed_gemm as pg

__all__ = ["packed_wins"]

_ROWS = 128  # the product measured: a sequence of 128 tokens, one batch
_RUNS = 5
_lock = threading.Lock()
_choices: dict[str, bool] | None = None


def _path() -> str:
    return os.path.join(cc.cache_dir(), f"gemm_choice_{cc.machine_tag()}.json")


def _load() -> dict[str, bool]:
    global _choices
    if _choices is None:
        try:
            with open(_path()) as f:
                _choices = {k: bool(v) for k, v in json.load(f).items()}
        except (OSError, ValueError):
            _choices = {}
    return _choices


def packed_wins(k: int, n: int, mkl_gemm: Callable) -> bool:
    """Whether braze's packed kernel is the faster fp32 GEMM for a [k, n] weight here, against
    `mkl_gemm(x, w, out)` (MKL's tiles; True without MKL: the alternative is NumPy's BLAS,
    measured slower on every machine so far)."""
    flag = os.environ.get("BRAZE_PACKED_GEMM", "auto")
    if flag in ("0", "1"):
        return flag == "1"
    if blas.sgemm_address() is None or native.lib() is None:
        return True
    key = f"{k}x{n}"
    with _lock:
        choices = _load()
        if key not in choices:
            choices[key] = _measure(k, n, mkl_gemm)
            _save(choices)
        return choices[key]


def _measure(k: int, n: int, mkl_gemm: Callable) -> bool:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n), dtype=np.float32)
    x = rng.standard_normal((_ROWS, k), dtype=np.float32)
    out = np.empty((_ROWS, n), np.float32)
    packed = pg.pack(w)
    if packed is None:
        return False
    runs = {"packed": lambda: pg.gemm(x, packed, out, None, 0),
            "mkl": lambda: mkl_gemm(x, w, out)}
    best = dict.fromkeys(runs, float("inf"))
    for fn in runs.values():
        fn()  # warm: caches, the thread team
    for r in range(_RUNS):
        for name in (list(runs) if r % 2 else list(runs)[::-1]):
            t = time.perf_counter()
            runs[name]()
            best[name] = min(best[name], time.perf_counter() - t)
    return best["packed"] <= best["mkl"]


def _save(choices: dict[str, bool]) -> None:
    path = _path()
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(choices, f)
        os.replace(tmp, path)
    except OSError:  # a read-only cache: measured again next process
        pass
