"""Differential fuzzer for bz.import_torch with several inputs: broadcasting between dynamic
inputs, bool masks, integer ids, a KV cache of its own length, f16 inputs. Each case is one
randomly parameterized module from CASES; bindings set each symbol to 0, 1, 2, 7 and the
example, compared against torch eager through bz.interpret, fuse + interpret and bz.compile.

    python fuzz/torch_import_fuzz_multi.py --cases 300 --seed 0 [--replay SEED]"""

from __future__ import annotations

import argparse
import collections
import logging
import traceback
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_import_fuzz import close

import braze as bz
from braze.errors import BrazeError

V = 11  # vocabulary of the id inputs


class Mod(nn.Module):
    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        self.m = nn.ModuleDict(mods)


class Mod1(Mod):
    def forward(self, a):
        return self.fn(self.m, a)


class Mod2(Mod):
    def forward(self, a, b):
        return self.fn(self.m, a, b)


class Mod3(Mod):
    def forward(self, a, b, c):
        return self.fn(self.m, a, b, c)


def arity(model, n):
    """`model` (a Mod) as the class whose forward takes n positional tensors."""
    model.__class__ = {1: Mod1, 2: Mod2, 3: Mod3}[n]
    return model


def _y_shape(kind):
    return {
        "full": ("B", "S", "F"),
        "b1": ("B", 1, "F"),
        "1s": (1, "S", "F"),
        "sf": ("S", "F"),
        "f": ("F",),
    }[kind]


def case_broadcast(rng, Fd):
    kind = str(rng.choice(["full", "b1", "1s", "sf", "f"]))
    op = str(rng.choice(["add", "mul", "max", "where", "div"]))
    fn = {
        "add": lambda m, x, y: x + y,
        "mul": lambda m, x, y: x * y,
        "max": lambda m, x, y: torch.maximum(x, y),
        "where": lambda m, x, y: torch.where(x > y, x, y * 2),
        "div": lambda m, x, y: x / (y.abs() + 1),
    }[op]
    return Mod(fn), [("x", ("B", "S", "F"), "f"), ("y", _y_shape(kind), "f")], f"{op}:{kind}"


def case_embedding(rng, Fd):
    pad = int(rng.integers(-1, 3))
    emb = nn.Embedding(V, Fd, padding_idx=pad if pad >= 0 else None)
    return (
        Mod(lambda m, x, ids: x + m["e"](ids), e=emb),
        [("x", ("B", "S", "F"), "f"), ("ids", ("B", "S"), "ids")],
        "emb",
    )


def case_masked_mean(rng, Fd):
    def fn(m, x, mask):
        w = mask[..., None].to(x.dtype)
        return (x * w).sum(1) / w.sum(1).clamp(min=1)

    return Mod(fn), [("x", ("B", "S", "F"), "f"), ("mask", ("B", "S"), "bool")], "masked_mean"


def case_padding_attention(rng, Fd):
    fill = float(rng.choice([-1e9, torch.finfo(torch.float32).min]))
    use_sdpa = bool(rng.integers(2))

    def fn(m, x, mask):
        q = m["q"](x)
        if use_sdpa:
            return F.scaled_dot_product_attention(
                q[:, None], x[:, None], x[:, None], attn_mask=mask[:, None, None, :]
            )[:, 0]
        s = (q @ x.transpose(1, 2)) / Fd**0.5
        s = s.masked_fill(~mask[:, None, :], fill)
        return s.softmax(-1) @ x

    return (
        Mod(fn, q=nn.Linear(Fd, Fd)),
        [("x", ("B", "S", "F"), "f"), ("mask", ("B", "S"), "bool_some")],
        f"pad_attn:{use_sdpa}",
    )


def case_kv_cache(rng, Fd):
    use_sdpa = bool(rng.integers(2))

    def fn(m, x, past):
        P, S = past.shape[1], x.shape[1]
        k = torch.cat([past, m["k"](x)], 1)
        q_pos = torch.arange(S) + P
        k_pos = torch.arange(P + S)
        allowed = k_pos[None, :] <= q_pos[:, None]
        if use_sdpa:
            return F.scaled_dot_product_attention(
                x[:, None], k[:, None], k[:, None], attn_mask=allowed
            )[:, 0]
        s = (x @ k.transpose(1, 2)).masked_fill(~allowed, float("-inf"))
        return s.softmax(-1) @ k

    return (
        Mod(fn, k=nn.Linear(Fd, Fd)),
        [("x", ("B", "S", "F"), "f"), ("past", ("B", "P", "F"), "f")],
        f"kv:{use_sdpa}",
    )


def case_gather_ids(rng, Fd):
    kind = int(rng.integers(4))

    def fn(m, x, ids):
        i = ids % x.shape[1]
        if kind == 0:
            return x.gather(1, i[..., None].expand(-1, -1, x.shape[2]))
        if kind == 1:
            return torch.zeros(x.shape[0], V, x.shape[2]).scatter_add(
                1, ids[..., None].expand(-1, -1, x.shape[2]), x
            )
        if kind == 2:
            return x[torch.arange(x.shape[0])[:, None], i]
        return (
            x.flatten(0, 1)
            .index_select(0, (i + torch.arange(x.shape[0])[:, None] * x.shape[1]).flatten())
            .view(x.shape)
        )

    return Mod(fn), [("x", ("B", "S", "F"), "f"), ("ids", ("B", "S"), "ids")], f"gather:{kind}"


def case_cross_entropy(rng, Fd):
    ignore = int(rng.choice([-100, 0, 3]))
    smooth = float(rng.choice([0.0, 0.1]))
    red = str(rng.choice(["mean", "sum", "none"]))

    def fn(m, x, ids):
        logits = m["w"](x)
        return F.cross_entropy(
            logits.flatten(0, 1),
            ids.flatten(),
            ignore_index=ignore,
            label_smoothing=smooth,
            reduction=red,
        )

    return (
        Mod(fn, w=nn.Linear(Fd, V)),
        [("x", ("B", "S", "F"), "f"), ("ids", ("B", "S"), "ids")],
        f"ce:{ignore}:{smooth}:{red}",
    )


def case_cat_other(rng, Fd):
    def fn(m, x, y):
        z = torch.cat([x, y], 1)
        return z - z.mean(1, keepdim=True)

    return Mod(fn), [("x", ("B", "S", "F"), "f"), ("y", ("B", "T", "F"), "f")], "cat_T"


def case_position_ids(rng, Fd):
    def fn(m, x, mask):
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return x + m["p"](pos)

    return (
        Mod(fn, p=nn.Embedding(64, Fd)),
        [("x", ("B", "S", "F"), "f"), ("mask", ("B", "S"), "bool")],
        "position_ids",
    )


def case_half(rng, Fd):
    dt = str(rng.choice(["f16", "bf16"]))

    def fn(m, x, y):
        return (x * y + x.mean(-1, keepdim=True)).softmax(-1).float()

    return Mod(fn), [("x", ("B", "S", "F"), dt), ("y", ("B", "S", "F"), dt)], f"half:{dt}"


def case_image(rng, Fd):
    kind = int(rng.integers(5))
    conv = nn.Conv2d(3, 4, 3, padding=1)

    def fn(m, x):
        if kind == 0:
            return m["c"](x)
        if kind == 1:
            return F.max_pool2d(m["c"](x), 2)
        if kind == 2:
            return F.interpolate(m["c"](x), scale_factor=2, mode="nearest")
        if kind == 3:
            return F.adaptive_avg_pool2d(m["c"](x), 1).flatten(1)
        return F.avg_pool2d(x, 2) + F.interpolate(x, scale_factor=0.5, mode="bilinear")

    return Mod(fn, c=conv), [("x", ("B", 3, "2*H", "2*W"), "f")], f"image:{kind}"


def case_ids_mix(rng, Fd):
    def fn(m, x, ids, mask):
        a = (ids > 3) & mask
        b = torch.where(a, ids, -ids) // 2
        return x * b[..., None].float() + a.sum(-1, keepdim=True)[..., None]

    return (
        Mod(fn),
        [("x", ("B", "S", "F"), "f"), ("ids", ("B", "S"), "ids"), ("mask", ("B", "S"), "bool")],
        "ids_mix",
    )


INT_OPS = {
    "truediv": lambda a, b: a / (b.abs() + 1),
    "floordiv": lambda a, b: a // (b.abs() + 1),
    "floordiv_neg": lambda a, b: a // -(b.abs() + 1),
    "remainder": lambda a, b: a % (b.abs() + 1),
    "remainder_neg": lambda a, b: torch.remainder(a, -(b.abs() + 1)),
    "fmod": lambda a, b: torch.fmod(a, b.abs() + 1),
    "mul": lambda a, b: a * b,
    "add_float": lambda a, b: a + 0.5,
    "mul_float": lambda a, b: a * 1.5 + b,
    "bitand": lambda a, b: a & b,
    "bitor": lambda a, b: a | b,
    "bitxor": lambda a, b: a ^ b,
    "shl": lambda a, b: a << 2,
    "shr": lambda a, b: a >> 1,
    "cmp": lambda a, b: (a > b) | (a == 3),
    "where": lambda a, b: torch.where(a > b, a, 7),
    "cumsum": lambda a, b: a.cumsum(-1),
    "sum": lambda a, b: a.sum(-1),
    "mean_float": lambda a, b: a.float().mean(-1),
    "max": lambda a, b: a.amax(-1),
    "argmax": lambda a, b: a.argmax(-1),
    "neg": lambda a, b: -a,
    "abs": lambda a, b: a.abs(),
    "clamp": lambda a, b: a.clamp(-3, 5),
    "clamp_f": lambda a, b: a.clamp(-2.5, 4.5),
    "pow": lambda a, b: a.abs() ** 2,
    "sign": lambda a, b: torch.sign(a),
    "sort": lambda a, b: a.sort(-1, stable=True).values,
    "topk": lambda a, b: a.topk(1, -1).values,
    "to_float_div": lambda a, b: a.float() / 3,
    "minimum": lambda a, b: torch.minimum(a, b),
    "prod": lambda a, b: a.clamp(-2, 2).prod(-1),
    "bool_sum": lambda a, b: (a > 0).sum(-1),
    "bool_cumsum": lambda a, b: (a > 0).cumsum(-1),
    "logical": lambda a, b: (a > 0) ^ (b > 0),
    "not": lambda a, b: ~(a > b),
    "bitnot": lambda a, b: ~a,
}


def case_int_ops(rng, Fd):
    dt = str(rng.choice(["i64", "i32", "i16", "i8", "u8", "bool"]))
    op = str(rng.choice(list(INT_OPS)))
    if dt == "bool" and op not in (
        "cmp",
        "bitand",
        "bitor",
        "bitxor",
        "logical",
        "not",
        "bitnot",
        "sum",
        "cumsum",
        "where",
        "mul",
        "add_float",
        "argmax",
        "max",
    ):
        dt = "i64"
    return (
        Mod(lambda m, a, b: INT_OPS[op](a, b)),
        [("a", ("B", "S", "F"), dt), ("b", ("B", "S", "F"), dt)],
        f"int:{op}:{dt}",
    )


CASES = [
    case_broadcast,
    case_embedding,
    case_masked_mean,
    case_padding_attention,
    case_kv_cache,
    case_gather_ids,
    case_cross_entropy,
    case_cat_other,
    case_position_ids,
    case_half,
    case_image,
    case_ids_mix,
    case_int_ops,
    case_int_ops,
    case_int_ops,
]
INT_KINDS = {
    "i64": np.int64,
    "i32": np.int32,
    "i16": np.int16,
    "i8": np.int8,
    "u8": np.uint8,
    "bool": bool,
}
DTYPES = {"f": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def make(spec, env, rng):
    name, dims, kind = spec
    shape = []
    for d in dims:
        if isinstance(d, int):
            shape.append(d)
        elif "*" in d:
            c, s = d.split("*")
            shape.append(int(c) * env[s])
        else:
            shape.append(env[d])
    if kind == "ids":
        return torch.from_numpy(rng.integers(0, V, shape))
    if kind in INT_KINDS:
        if kind == "bool":
            return torch.from_numpy(rng.random(shape) < 0.5)
        lo, hi = (0, 256) if kind == "u8" else (-128, 128) if kind == "i8" else (-50, 50)
        return torch.from_numpy(rng.integers(lo, hi, shape).astype(INT_KINDS[kind]))
    if kind == "bool":
        return torch.from_numpy(rng.random(shape) < 0.6)
    if kind == "bool_some":
        m = rng.random(shape) < 0.6
        if m.ndim == 2 and m.shape[1] > 0:
            m[:, 0] = True
        return torch.from_numpy(m)
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(DTYPES[kind])


def dynamic_spec(specs, mode):
    out = []
    for _name, dims, _ in specs:
        axes = {}
        for ax, d in enumerate(dims):
            if (
                isinstance(d, str)
                and d != "F"
                and (mode == "all" or d in ("S", "P", "T", "2*H", "2*W"))
            ):
                axes[ax] = d.replace("*H", "*h").replace("*W", "*w") if "*" in d else d.lower()
        out.append(axes or None)
    return tuple(out)


def run_case(seed, do_compile):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    Fd = int(rng.integers(1, 6))
    fn = CASES[int(rng.integers(len(CASES)))]
    model, specs, label = fn(rng, Fd)
    model = arity(model, len(specs)).eval()
    mode = str(rng.choice(["all", "seq"]))
    example = {
        "B": int(rng.integers(2, 4)),
        "S": int(rng.integers(2, 6)),
        "P": int(rng.integers(2, 6)),
        "T": int(rng.integers(2, 6)),
        "F": Fd,
        "H": int(rng.integers(2, 4)),
        "W": int(rng.integers(2, 4)),
    }
    args = tuple(make(s, example, rng) for s in specs)
    try:
        with torch.no_grad():
            model(*args)
    except Exception as e:  # noqa: BLE001
        return "torch_err", label, str(e)[:200]
    try:
        g = bz.import_torch(model, args, dynamic_shapes=dynamic_spec(specs, mode))
    except BrazeError as e:
        kind = "export_err" if "torch.export failed" in str(e) else "import_err"
        return kind, label, str(e)[:400]
    except Exception as e:  # noqa: BLE001
        return "CRASH", label, "import: " + "".join(traceback.format_exception_only(e))[:500]
    try:
        fused, _ = bz.fuse(g, "cpu")
        exe = bz.compile(g, target="cpu") if do_compile else None
    except Exception as e:  # noqa: BLE001
        return "CRASH", label, "fuse/compile: " + "".join(traceback.format_exception_only(e))[:500]
    names = [v.op.name for v in g.inputs]
    dyn_syms = [
        k
        for k in ("B", "S", "P", "T", "H", "W")
        if any(k in str(d) for s in specs for d in s[1])
        and (mode == "all" or k in ("S", "P", "T", "H", "W"))
    ]
    bindings = [dict(example)]
    for k in dyn_syms:
        for v in (0, 1, 2, 7):
            bindings.append({**example, k: v})
    bindings.append({**example, **{k: 1 for k in dyn_syms}})
    notes, status = [], "ok"
    for i, env in enumerate(bindings):
        r = np.random.default_rng(seed * 7 + i)
        feeds_t = [make(s, env, r) for s in specs]
        try:
            with torch.no_grad():
                want = model(*feeds_t)
        except Exception:  # noqa: BLE001
            continue
        want = want.float().numpy() if want.dtype == torch.bfloat16 else want.numpy()
        feeds = {
            n: (t.float().numpy().astype(bz.bf16.np) if t.dtype == torch.bfloat16 else t.numpy())
            for n, t in zip(names, feeds_t)
        }
        runs = [
            ("interpret", lambda f=feeds: bz.interpret(g, f)),
            ("fuse", lambda f=feeds: bz.interpret(fused, f)),
        ]
        if exe is not None:
            runs.append(("compile", lambda f=feeds: exe(f)))
        for how, run in runs:
            try:
                got = np.asarray(run()[0])
            except BrazeError as e:
                if i == 0:
                    return "CRASH", label, f"example refused by {how}: {e}"[:500]
                notes.append(f"{env} {how} refused: {str(e)[:120]}")
                status = "refused"
                continue
            except Exception as e:  # noqa: BLE001
                return (
                    "CRASH",
                    label,
                    f"{env} {how}: " + "".join(traceback.format_exception_only(e))[:500],
                )
            err = close(
                got.astype(np.float32) if got.dtype == bz.bf16.np else got, want, "half" in label
            )
            if err:
                return "MISMATCH", label, f"{ {k: env[k] for k in dyn_syms} } {how}: {err}"
    return status, label, "; ".join(notes)[:300]


def main():
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-every", type=int, default=3)
    ap.add_argument("--replay", type=int)
    a = ap.parse_args()
    seeds = [a.replay] if a.replay is not None else range(a.seed, a.seed + a.cases)
    counts, per = collections.Counter(), collections.defaultdict(collections.Counter)
    for seed in seeds:
        do_c = a.replay is not None or seed % a.compile_every == 0
        try:
            st, label, msg = run_case(seed, do_c)
        except Exception as e:  # noqa: BLE001
            st, label, msg = "CRASH", "?", "driver: " + repr(e)[:300]
        counts[st] += 1
        per[label.split(":")[0]][st] += 1
        if st in ("MISMATCH", "CRASH", "import_err", "export_err") or a.replay is not None:
            print(f"{st} seed={seed} {label}: {msg}", flush=True)
    print("TOTAL", dict(counts), flush=True)
    for k in sorted(per):
        print("  ", k, dict(per[k]))


if __name__ == "__main__":
    main()
