"""Which fp32 GEMM runs a static weight of a given shape on this machine: braze's packed-weight
kernel (packed_gemm.py, "packed"), MKL's sgemm in per-thread tiles with the C epilogue
(fused.gemm_bias_act, "tiles"), or MKL's own packed-weight sgemm then the epilogue
(mkl_packed.py, "mkl_packed"), measured once per weight shape and machine, and remembered in
the kernel cache.

They trade places by CPU: on the AVX2 EPYC VM of earlier sessions the packed kernel took
0.80-0.86x the MKL tiles' time end to end; on the AMX / AVX-512 Xeon VM of 2026-11-27 MKL won
(BERT-base sdpa b1: 152 ms median with MKL tiles against 176 packed, in one process,
alternating), and MKL's packed sgemm beat both at 128-row products, until braze's kernel
moved to 6 x 64 micro blocks (session 11), which win most 128-row shapes there. So none is a
fixed default: the first time a shape is seen, each runs a 128-row product (with the node's
bias and activation where it has them) 15 times, alternating (the lowest median of each
call's time over its round's mean; two such measurements, and a third where they disagree)
and the winner is recorded in `$BRAZE_CACHE_DIR/gemm_choice_<machine>.json` (or the file
`$BRAZE_GEMM_CHOICES` names: the test suite keeps its measurements, taken on a busy machine,
out of the user's file).
`BRAZE_FP32_GEMM=packed|tiles|mkl_packed` forces one (`BRAZE_PACKED_GEMM=1` / `0`: packed /
tiles)."""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable

import numpy as np

from ..codegen import cc
from . import blas, mkl_packed, native
from . import packed_gemm as pg

__all__ = ["choose", "choose_bf16", "choose_keyed", "fp32_key", "bf16_key",
           "forced", "CHOICES", "BF16_CHOICES", "CONV_CHOICES", "BATCHED_CHOICES"]

CHOICES = ("packed", "tiles", "mkl_packed")
BF16_CHOICES = ("mkl", "amx", "dp")  # bf16_gemm.py: MKL's, amx_gemm.py, dpbf16_gemm.py
CONV_CHOICES = ("shifted", "rows", "im2col")  # conv.py: conv_tiles.py's two, im2col + MKL
BATCHED_CHOICES = ("bf16_batched", "f32_rounded")  # bf16_batched.py, or the policy's f32 GEMM

_ROWS = 128  # the product measured: a sequence of 128 tokens, one batch
_RUNS = 15
_lock = threading.Lock()
_choices: dict[str, str] | None = None


def _path() -> str:
    return os.environ.get("BRAZE_GEMM_CHOICES") or os.path.join(
        cc.cache_dir(), f"gemm_choice_{cc.machine_tag()}.json")


def _load() -> dict[str, str]:
    global _choices
    if _choices is None:
        try:
            with open(_path()) as f:  # an older file's true / false entries are measured again
                _choices = {k: v for k, v in json.load(f).items()
                            if v in CHOICES + BF16_CHOICES + CONV_CHOICES + BATCHED_CHOICES}
        except (OSError, ValueError, AttributeError):
            _choices = {}
    return _choices


def forced() -> str | None:
    """The GEMM the environment forces (BRAZE_FP32_GEMM, or BRAZE_PACKED_GEMM=1 / 0), or None."""
    flag = os.environ.get("BRAZE_FP32_GEMM", "auto")
    if flag in CHOICES:
        return flag
    return {"1": "packed", "0": "tiles"}.get(os.environ.get("BRAZE_PACKED_GEMM", "auto"))


def choose(k: int, n: int, tiles: Callable, act: int = 0, bias: bool = False) -> str:
    """The fastest fp32 GEMM here for a static [k, n] weight, one of CHOICES; `tiles(x, w,
    out, bias, act)` runs MKL's tiles. With a bias (`bias`) or an activation `act` (a
    c_snippets.ACT_CODES value; measured with a bias too) the runs measured add them, as the node
    will: braze's kernel applies them per tile in cache, MKL's packed sgemm in a pass after
    the product. Without MKL the packed kernel is the choice (the alternative, NumPy's BLAS,
    measured slower on every machine so far)."""
    flag = forced()
    if flag is not None:
        return flag
    if blas.sgemm_address() is None or native.lib() is None:
        return "packed"
    return _remembered(fp32_key(k, n, act, bias),
                       lambda: _agreed(_fp32_runs(*_operands(k, n), tiles, act, bias)))


def fp32_bias(n: int) -> np.ndarray:
    """The bias a choice with a bias or an activation is measured with."""
    return np.linspace(-1, 1, n, dtype=np.float32)


def fp32_key(k: int, n: int, act: int = 0, bias: bool = False) -> str:
    """The choice file's key for a float32 [k, n] weight, with ":actN" for an activation code
    N (measured with a bias) or ":bias" for a bias alone (MiniLM's attention projections,
    with their biases, ran 0.96-0.97x the time on braze's kernel in the model, where the
    plain product's measurement had chosen MKL's packed sgemm). "fp32-3": measured since
    braze's packed kernel runs 6 x 64 micro blocks under AVX-512 (before, 12 x 16 ones, it
    ran ~0.75x as fast and MKL won every shape it now wins) in tiles of equal size (768 x
    768 then moved from MKL's tiles to it), so older entries ("KxN", "fp32-2:") are measured
    again."""
    return f"fp32-3:{k}x{n}" + (f":act{act}" if act else ":bias" if bias else "")


def choose_bf16(k: int, n: int, runs: Callable) -> str:
    """The faster bf16 GEMM here for a [k, n] weight, one of BF16_CHOICES; `runs(x, w)` gives
    {choice: callable} for a 128-row product (bf16_gemm.py builds them)."""
    return _remembered(bf16_key(k, n), lambda: _agreed(runs(*_operands(k, n))))


def bf16_key(k: int, n: int) -> str:
    """The choice file's key for a bf16 [k, n] weight. "bf16-3": measured since braze's
    AVX512-BF16 kernel (dpbf16_gemm.py) is a candidate, so older entries ("bf16:", "bf16-2:",
    measured between MKL and AMX tiles alone) are measured again."""
    return f"bf16-3:{k}x{n}"


def choose_keyed(key: str, runs: Callable[[], dict[str, Callable]]) -> str:
    """The fastest of the runs `runs()` gives ({choice: callable} on operands of the geometry
    `key` names) here, measured once: a conv's path (conv.py, one of CONV_CHOICES) or a
    batched matmul of rounded operands (bf16_batched.py, one of BATCHED_CHOICES)."""
    return _remembered(key, lambda: _agreed(runs()))


def stand_in(key: str, distance: Callable[[str], float | None]) -> str | None:
    """The choice recorded under `key`, else the one recorded under the key nearest by
    `distance` (None for keys that may not stand in), else None: a conv at a new image size
    takes the path measured at a similar one instead of measuring again (a dynamic-size
    detector met each new size with 48 measurements, 3.7 s)."""
    with _lock:
        choices = _load()
        if key in choices:
            return choices[key]
        near = [(d, k) for k in choices if (d := distance(k)) is not None]
        return choices[min(near)[1]] if near else None


def _remembered(key: str, measure: Callable[[], str]) -> str:
    """The choice recorded under `key`, measured (and saved) the first time it is asked for."""
    with _lock:
        choices = _load()
        if key not in choices:
            choices[key] = measure()
            _save(choices)
        return choices[key]


def _operands(k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The measured product's x [_ROWS, k] and w [k, n], w scaled by 1 / sqrt(k) so the
    product is of unit scale, as a layer's is (an activation's cost depends on its inputs:
    with |v| ~ sqrt(k), MKL's packed sgemm won 3 of 3 measurements of the tanh GELU GEMM at
    768 x 3072 that braze's kernel wins 3 of 3 at unit scale)."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal((_ROWS, k), dtype=np.float32),
            rng.standard_normal((k, n), dtype=np.float32) / np.float32(np.sqrt(k)))


def _agreed(runs: dict[str, Callable]) -> str:
    """The fastest of `runs` in two measurements, or the majority of three where the first two
    disagree (a busy moment on a shared machine can crown the wrong one, and it is kept)."""
    first, second = _fastest(runs), _fastest(runs)
    if first == second:
        return first
    third = _fastest(runs)
    return third if third in (first, second) else first


def _fastest(runs: dict[str, Callable]) -> str:
    """The name of the fastest call, after a warm call each: _RUNS rounds of one call each,
    alternating, each call's time divided by its round's mean, and the lowest median of
    those. A slow stretch of a shared machine longer than a round slows every call of it
    alike and cancels; the best of a few calls (the rule before) was often one lucky call,
    and the plain median still followed stretches of a few calls."""
    rounds: list[dict[str, float]] = []
    for fn in runs.values():
        fn()  # warm: caches, the thread team
    for r in range(_RUNS):
        times = {}
        for name in (list(runs) if r % 2 else list(runs)[::-1]):
            t = time.perf_counter()
            runs[name]()
            times[name] = time.perf_counter() - t
        mean = sum(times.values()) / len(times)
        rounds.append({name: t / mean for name, t in times.items()})
    return min(runs, key=lambda name: float(np.median([r[name] for r in rounds])))


def _fp32_runs(x: np.ndarray, w: np.ndarray, tiles: Callable, act: int = 0, bias: bool = False,
               out: np.ndarray | None = None) -> dict[str, Callable]:
    """Each fp32 GEMM available here on `out = act(x @ w + b)` (b = fp32_bias with `bias`
    or an activation, else none), by choice name."""
    out = np.empty((x.shape[0], w.shape[1]), np.float32) if out is None else out
    bias = fp32_bias(w.shape[1]) if act or bias else None
    runs = {"tiles": lambda: tiles(x, w, out, bias, act)}
    packed = pg.pack(w)
    if packed is not None:
        runs["packed"] = lambda: pg.gemm(x, packed, out, bias, act)
    mkl = mkl_packed.pack(w)
    if mkl is not None:
        runs["mkl_packed"] = lambda: mkl_packed.gemm(x, mkl, out, bias, act)
    return runs


def _save(choices: dict[str, str]) -> None:
    path = _path()
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(choices, f)
        os.replace(tmp, path)
    except OSError:  # a read-only cache: measured again next process
        pass
