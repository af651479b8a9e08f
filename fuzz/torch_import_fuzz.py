"""Differential fuzzer for bz.import_torch: random small modules built from the ATen ops
torch.export writes for common code, compared against torch eager through bz.interpret,
bz.fuse + interpret and bz.compile on fresh inputs at several bindings of the dynamic dims.

    python fuzz/torch_import_fuzz.py --cases 500 --seed 0 [--compile-every 5] [--only NAME]

Each case chains 1-3 snippets acting on x of shape [B, S, F] (F static). A failure is printed
with its seed and snippet names so that `--replay SEED` reruns it alone. Outcomes:
ok (all agree), refused (braze refused a binding, naming why), torch_err (torch eager failed at
that binding: nothing to compare), export_err (torch.export failed), import_err (braze refused the
import), MISMATCH (a silently wrong result) and CRASH (a non-braze exception)."""

from __future__ import annotations

import argparse
import collections
import logging
import traceback
import warnings

import numpy as np
import torch
from torch import nn
from torch_fuzz_snippets import SNIPPETS

import braze as bz
from braze.errors import BrazeError


# -- driver ---------------------------------------------------------------------------------
class Chain(nn.Module):
    def __init__(self, parts):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x):
        for p in self.parts:
            x = p(x)
        return x


def build(seed, only=None, n_max=3):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    F_ = int(rng.integers(1, 7))
    F0 = F_
    names, parts = [], []
    for _ in range(int(rng.integers(1, n_max + 1))):
        pool = [n for n in SNIPPETS if not n.startswith("ew_")]
        if rng.random() < 0.25:
            pool = [n for n in SNIPPETS if n.startswith("ew_")]
        name = only if only and not names else rng.choice(pool)
        if only and names and rng.integers(2):
            name = only
        mod, F_ = SNIPPETS[name][0](rng, F_)
        names.append(str(name))
        parts.append(mod)
        if F_ < 1 or F_ > 64:
            break
    return Chain(parts).eval(), F0, names, rng


def dyn_spec(rng):
    kind = int(rng.integers(4))
    from torch.export import Dim

    if kind == 0:
        return "static", None
    if kind == 1:
        return "names", {"x": ("batch", "seq", None)}
    if kind == 2:
        return "seq", {"x": {1: "seq"}}
    return "dims", {"x": {0: Dim("b", min=1, max=16), 1: Dim("s", min=1, max=32)}}


def close(a, b, loose):
    if a.shape != b.shape:
        return f"shape {a.shape} vs torch {b.shape}"
    if a.dtype.kind in "iub" or b.dtype.kind in "iub":
        if not np.array_equal(a.astype(np.float64), b.astype(np.float64)):
            return f"int mismatch {np.argwhere(a != b)[:3].tolist()}"
        return None
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    tol = 3e-2 if loose else 2e-4
    bad = ~np.isclose(a64, b64, rtol=tol, atol=tol, equal_nan=True)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        return f"{bad.sum()} of {bad.size} differ, e.g. at {i}: braze {a64[i]} torch {b64[i]}"
    return None


def run_case(seed, only=None, do_compile=False, verbose=False):
    model, F0, names, rng = build(seed, only)
    mode, spec = dyn_spec(rng)
    ex_b, ex_s = int(rng.integers(2, 5)), int(rng.integers(2, 8))
    x = torch.randn(ex_b, ex_s, F0)
    try:
        with torch.no_grad():
            model(x)
    except Exception as e:  # noqa: BLE001
        return "torch_err", names, mode, f"eager: {e}"[:200]
    try:
        g = bz.import_torch(model, (x,), dynamic_shapes=spec)
    except BrazeError as e:
        msg = str(e)
        if "torch.export failed" in msg or "torch.export" in msg[:200] and "failed" in msg[:300]:
            return "export_err", names, mode, msg[:300]
        return "import_err", names, mode, msg[:400]
    except Exception as e:  # noqa: BLE001
        return "CRASH", names, mode, "import: " + "".join(traceback.format_exception_only(e))[:600]
    loose = any(n in ("dtype", "library") or n.startswith("topk") for n in names)
    bindings = [(ex_b, ex_s)]
    if spec is not None:
        for b, s in ((1, 1), (2, 1), (1, 7), (7, 2), (3, 5), (2, 0)):
            bindings.append((b if mode != "seq" else ex_b, s))
    try:
        fused, _ = bz.fuse(g, "cpu")
    except BrazeError as e:
        return "CRASH", names, mode, f"fuse braze error: {e}"[:600]
    except Exception as e:  # noqa: BLE001
        return "CRASH", names, mode, "fuse: " + "".join(traceback.format_exception_only(e))[:600]
    exe = None
    if do_compile:
        try:
            exe = bz.compile(g, target="cpu")
        except Exception as e:  # noqa: BLE001
            return (
                "CRASH",
                names,
                mode,
                "compile: " + "".join(traceback.format_exception_only(e))[:600],
            )
    status = "ok"
    notes = []
    for i, (b, s) in enumerate(bindings):
        xi = torch.from_numpy(
            np.random.default_rng(seed * 31 + i).normal(size=(b, s, F0)).astype(np.float32)
        )
        try:
            with torch.no_grad():
                want = model(xi)
        except Exception:  # noqa: BLE001
            notes.append(f"({b},{s}) torch_err")
            continue
        want = want.detach().numpy() if want.dtype != torch.bfloat16 else want.float().numpy()
        runs = [
            ("interpret", lambda xi=xi: bz.interpret(g, {"x": xi.numpy()})),
            ("fuse", lambda xi=xi: bz.interpret(fused, {"x": xi.numpy()})),
        ]
        if exe is not None:
            runs.append(("compile", lambda xi=xi: exe({"x": xi.numpy()})))
        for how, fn in runs:
            try:
                got = fn()[0]
            except BrazeError as e:
                notes.append(f"({b},{s}) {how} refused: {str(e)[:150]}")
                if i == 0:
                    return "CRASH", names, mode, f"example binding refused by {how}: {e}"[:600]
                continue
            except Exception as e:  # noqa: BLE001
                return (
                    "CRASH",
                    names,
                    mode,
                    f"({b},{s}) {how}: " + "".join(traceback.format_exception_only(e))[:600],
                )
            err = close(np.asarray(got), want, loose)
            if err and "torch nan" in err and "masked_fill" in names:
                return "safe_softmax", names, mode, err  # braze's softmax of all -inf is 0
            if err:
                return "MISMATCH", names, mode, f"({b},{s}) {how}: {err}"
    if any("refused" in n for n in notes):
        status = "refused"
    return status, names, mode, "; ".join(notes)[:300]


def main():
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-every", type=int, default=0)
    ap.add_argument("--only")
    ap.add_argument("--replay", type=int)
    ap.add_argument("-v", action="store_true")
    a = ap.parse_args()
    seeds = [a.replay] if a.replay is not None else range(a.seed, a.seed + a.cases)
    counts = collections.Counter()
    per_snippet = collections.defaultdict(collections.Counter)
    for seed in seeds:
        do_c = a.replay is not None or (a.compile_every and seed % a.compile_every == 0)
        try:
            st, names, mode, msg = run_case(seed, a.only, do_c)
        except Exception as e:  # noqa: BLE001
            st, names, mode, msg = "CRASH", ["?"], "?", "driver: " + repr(e)[:300]
        counts[st] += 1
        for n in names:
            per_snippet[n][st] += 1
        if st in ("MISMATCH", "CRASH", "import_err") or a.v or a.replay is not None:
            print(f"{st} seed={seed} mode={mode} {'+'.join(names)}: {msg}", flush=True)
    print("TOTAL", dict(counts), flush=True)
    for n in sorted(per_snippet):
        print("  ", n, dict(per_snippet[n]))


if __name__ == "__main__":
    main()
