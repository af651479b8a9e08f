"""The snippets torch_import_fuzz.py chains: small nn.Modules from the ATen ops torch.export
writes for common code, each `fn(rng, F) -> (module, F')` acting on x [B, S, F]."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

SNIPPETS = {}


def snippet(name, kind="any"):
    def deco(fn):
        SNIPPETS[name] = (fn, kind)
        return fn

    return deco


class Lam(nn.Module):
    def __init__(self, fn, *mods, **kw):
        super().__init__()
        self.fn = fn
        self.mods = nn.ModuleList(mods)
        for k, v in kw.items():
            self.register_buffer(k, v)

    def forward(self, x):
        return self.fn(self, x)


# -- elementwise --------------------------------------------------------------------------
UNARY = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "exp": lambda x: torch.exp(x.clamp(max=5)),
    "log1p_abs": lambda x: torch.log(x.abs() + 1),
    "sqrt_abs": lambda x: x.abs().sqrt(),
    "abs": torch.abs,
    "neg": torch.neg,
    "pow2": lambda x: x**2,
    "pow3": lambda x: x.pow(3),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 1),
    "softplus": F.softplus,
    "elu": F.elu,
    "leaky": lambda x: F.leaky_relu(x, 0.2),
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "mish": F.mish,
    "erf": torch.erf,
    "sin": torch.sin,
    "cos": torch.cos,
    "floor": lambda x: torch.floor(x * 3),
    "ceil": lambda x: torch.ceil(x * 3),
    "round": lambda x: torch.round(x * 3),
    "sign": torch.sign,
    "clamp": lambda x: x.clamp(-0.5, 0.7),
    "recip": lambda x: 1.0 / (x.abs() + 0.5),
    "remainder": lambda x: torch.remainder(x * 3, 1.5),
    "fmod": lambda x: torch.fmod(x * 3, 1.5),
    "trunc": lambda x: torch.trunc(x * 3),
    "logsigmoid": F.logsigmoid,
    "selu": F.selu,
    "celu": F.celu,
    "relu6": lambda x: F.relu6(x * 4),
    "hardtanh": F.hardtanh,
    "max_flip": lambda x: torch.maximum(x, x.flip(-1)),
    "min_flip": lambda x: torch.minimum(x, -x),
    "atan2": lambda x: torch.atan2(x, x.flip(-1) + 0.1),
    "softsign": F.softsign,
    "tanhshrink": F.tanhshrink,
    "hardshrink": F.hardshrink,
    "softshrink": F.softshrink,
    "frac": lambda x: torch.frac(x * 3),
    "square": torch.square,
    "addcmul": lambda x: torch.addcmul(x, x, x.flip(-1), value=0.5),
    "lerp": lambda x: torch.lerp(x, x.flip(-1), 0.3),
    "xlogy": lambda x: torch.xlogy(x.abs(), x.abs() + 1),
    "div_floor": lambda x: torch.div(x * 3, 0.7, rounding_mode="floor"),
    "div_trunc": lambda x: torch.div(x * 3, 0.7, rounding_mode="trunc"),
    "threshold": lambda x: F.threshold(x, 0.1, 20.0),
    "expm1": torch.expm1,
    "logit": lambda x: torch.logit(torch.sigmoid(x), eps=1e-6),
    "sinh": torch.sinh,
    "asinh": torch.asinh,
    "atan": torch.atan,
    "reciprocal": lambda x: torch.reciprocal(x.abs() + 1),
    "nan_to_num": lambda x: torch.nan_to_num(torch.log(x)),
    "isnan": lambda x: torch.where(torch.isnan(torch.log(x)), 0.0, x),
    "clamp_t": lambda x: torch.clamp(x, min=x.flip(-1) - 0.1, max=x.flip(-1) + 0.1),
}

for _n, _f in UNARY.items():
    snippet("ew_" + _n)(lambda rng, F_, f=_f: (Lam(lambda m, x: f(x)), F_))


# -- reductions -----------------------------------------------------------------------------
REDUCE = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k),
    "mean": lambda x, d, k: x.mean(d, keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k),
    "amin": lambda x, d, k: x.amin(d, keepdim=k),
    "prod": lambda x, d, k: (x * 0.3 + 1).prod(d, keepdim=k),
    "var": lambda x, d, k: x.var(d, keepdim=k),
    "std": lambda x, d, k: x.std(d, keepdim=k, correction=0),
    "logsumexp": lambda x, d, k: torch.logsumexp(x, d, keepdim=k),
    "norm": lambda x, d, k: torch.linalg.vector_norm(x, 2, d, keepdim=k),
    "max": lambda x, d, k: x.max(d, keepdim=k).values,
    "min": lambda x, d, k: x.min(d, keepdim=k)[0],
    "argmax": lambda x, d, k: x.argmax(d, keepdim=k).float(),
    "argmin": lambda x, d, k: x.argmin(d, keepdim=k).float(),
    "any": lambda x, d, k: (x > 1).any(d, keepdim=k).float(),
    "all": lambda x, d, k: (x > -1).all(d, keepdim=k).float(),
    "count": lambda x, d, k: (x > 0).sum(d, keepdim=k).float(),
    "median": lambda x, d, k: x.median(d, keepdim=k).values,
}


@snippet("reduce")
def _reduce(rng, F_):
    name = rng.choice(list(REDUCE))
    f = REDUCE[name]
    d = int(rng.choice([-1, -2, 1, 2, 0]))
    k = bool(rng.integers(2))

    def fn(m, x):
        r = f(x, d, k)
        if not k:
            r = r.unsqueeze(d)
        return x - r

    return Lam(fn), F_


@snippet("softmax")
def _softmax(rng, F_):
    d = int(rng.choice([-1, 1, -2, 0]))
    log = bool(rng.integers(2))
    return Lam(lambda m, x: (F.log_softmax if log else F.softmax)(x, d)), F_


@snippet("cumsum")
def _cum(rng, F_):
    d = int(rng.choice([-1, 1, -2]))
    kind = rng.choice(["sum", "prod", "max", "logcumsumexp"])
    if kind == "sum":
        return Lam(lambda m, x: x.cumsum(d)), F_
    if kind == "prod":
        return Lam(lambda m, x: (x * 0.2 + 1).cumprod(d)), F_
    if kind == "max":
        return Lam(lambda m, x: x.cummax(d).values), F_
    return Lam(lambda m, x: torch.logcumsumexp(x, d)), F_


# -- indexing -------------------------------------------------------------------------------
@snippet("slice")
def _slice(rng, F_):
    a = int(rng.integers(0, 3))
    step = int(rng.choice([1, 1, 2, 3]))
    axis = int(rng.choice([1, 2]))
    neg = bool(rng.integers(2))
    if axis == 2:
        start = min(a, F_ - 1)
        if neg:
            sl = slice(-F_ + start, None, step)
        else:
            sl = slice(start, None, step)
        n = len(range(F_)[sl])
        return Lam(lambda m, x: x[:, :, sl]), n
    kind = rng.choice(["start", "end", "neg_end", "neg_start", "both"])
    sl = {
        "start": slice(a, None, step),
        "end": slice(None, a + 1, step),
        "neg_end": slice(None, -a - 1, step),
        "neg_start": slice(-a - 1, None, step),
        "both": slice(a, -1, step),
    }[kind]
    return Lam(lambda m, x: x[:, sl]), F_


@snippet("select_neg")
def _select(rng, F_):
    i = int(rng.integers(-2, 2))
    return Lam(lambda m, x: x - x[:, i : i + 1 if i != -1 else None] if True else x), F_


@snippet("flip")
def _flip(rng, F_):
    d = rng.choice([[1], [2], [1, 2]]).tolist() if False else [int(rng.choice([1, 2, -1]))]
    return Lam(lambda m, x: x.flip(d) + x), F_


@snippet("index_select")
def _index_select(rng, F_):
    n = int(rng.integers(1, F_ + 2))
    idx = torch.from_numpy(rng.integers(-F_ if rng.integers(2) else 0, F_, n))
    idx = torch.where(idx < 0, idx + F_, idx)
    return Lam(lambda m, x: torch.index_select(x, 2, m.idx), idx=idx), n


@snippet("gather")
def _gather(rng, F_):
    def fn(m, x):
        i = (x.abs() * 7).long() % x.shape[-1]
        return torch.gather(x, -1, i)

    return Lam(fn), F_


@snippet("scatter")
def _scatter(rng, F_):
    red = rng.choice(["none", "add", "sum", "amax", "mean"])

    def fn(m, x):
        i = (x.abs() * 7).long() % x.shape[-1]
        if red == "none":
            return torch.zeros_like(x).scatter(-1, i[..., :1], x[..., :1])
        if red == "add":
            return torch.zeros_like(x).scatter_add(-1, i, x)
        return x.scatter_reduce(-1, i, x, reduce=red, include_self=bool(len(red) % 2))

    return Lam(fn), F_


@snippet("masked_fill")
def _masked_fill(rng, F_):
    v = float(rng.choice([0.0, -1e4, 2.5, -math.inf]))
    if v == -math.inf:
        return Lam(lambda m, x: torch.softmax(x.masked_fill(x < -1, v), -1)), F_
    return Lam(lambda m, x: x.masked_fill(x > 0.3, v)), F_


@snippet("where")
def _where(rng, F_):
    kind = int(rng.integers(3))
    if kind == 0:
        return Lam(lambda m, x: torch.where(x > 0, x, x * 0.1)), F_
    if kind == 1:
        return Lam(lambda m, x: torch.where(x > 0, x, 0.5)), F_
    return Lam(lambda m, x: torch.where(x > 0, 1.0, -2)), F_


@snippet("adv_index")
def _adv(rng, F_):
    n = int(rng.integers(1, 5))
    idx = [int(v) for v in rng.integers(-F_, F_, n)]
    kind = int(rng.integers(3))
    if kind == 0:
        return Lam(lambda m, x: x[:, :, idx]), n
    if kind == 1:
        return Lam(lambda m, x: x[..., m.idx], idx=torch.tensor(idx)), n
    return Lam(lambda m, x: x[:, torch.arange(x.shape[1]).flip(0)]), F_


@snippet("mask_index")
def _mask_index(rng, F_):
    return Lam(
        lambda m, x: torch.where(m.mask, x, 0.0),
        mask=torch.from_numpy(rng.integers(0, 2, F_).astype(bool)),
    ), F_


# -- shape -------------------------------------------------------------------------------
@snippet("reshape")
def _reshape(rng, F_):
    kind = int(rng.integers(6))
    if kind == 0:
        return Lam(lambda m, x: x.reshape(x.shape[0], -1).reshape(x.shape)), F_
    if kind == 1:
        return Lam(lambda m, x: x.permute(0, 2, 1).contiguous().permute(0, 2, 1) * 2), F_
    if kind == 2:
        return Lam(lambda m, x: x.flatten(0, 1).unflatten(0, (x.shape[0], -1))), F_
    if kind == 3:
        return Lam(lambda m, x: x.unsqueeze(2).expand(-1, -1, 2, -1).flatten(2)), 2 * F_
    if kind == 4:
        return Lam(
            lambda m, x: x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1).transpose(1, 2)
        ), F_
    return Lam(lambda m, x: x.view(-1, x.shape[-1]).view(x.shape[0], x.shape[1], x.shape[2])), F_


@snippet("chunk")
def _chunk(rng, F_):
    k = int(rng.integers(1, 4))
    kind = int(rng.integers(3))
    if kind == 0:
        return Lam(lambda m, x: torch.cat(list(reversed(x.chunk(k, -1))), -1)), F_
    if kind == 1:
        sizes = [1, F_ - 1] if F_ > 1 else [1]
        return Lam(lambda m, x: torch.cat(list(reversed(x.split(sizes, -1))), -1)), F_
    return Lam(
        lambda m, x: (
            torch.stack(x.split(1, 1), 1).squeeze(2) if False else torch.stack([x, -x], 2).sum(2)
        )
    ), F_


@snippet("cat_seq")
def _cat_seq(rng, F_):
    return Lam(lambda m, x: torch.cat([x, x[:, :1]], 1)), F_


@snippet("unbind")
def _unbind(rng, F_):
    return Lam(lambda m, x: torch.stack(x.unbind(-1)[::-1], -1)), F_


# -- linear algebra -------------------------------------------------------------------------
@snippet("linear")
def _linear(rng, F_):
    out = int(rng.integers(1, 9))
    bias = bool(rng.integers(2))
    return Lam(lambda m, x: m.mods[0](x), nn.Linear(F_, out, bias=bias)), out


@snippet("matmul")
def _matmul(rng, F_):
    kind = int(rng.integers(5))
    if kind == 0:
        return Lam(lambda m, x: (x @ x.transpose(-1, -2)) @ x * 0.1), F_
    if kind == 1:
        return Lam(lambda m, x: torch.bmm(x, x.transpose(1, 2)).softmax(-1).bmm(x)), F_
    if kind == 2:
        return Lam(lambda m, x: torch.einsum("bsf,bsg->bfg", x, x).sum(1, keepdim=True) + x), F_
    if kind == 3:
        return Lam(
            lambda m, x: torch.baddbmm(x, x, m.w.expand(x.shape[0], -1, -1), beta=0.5, alpha=0.3),
            w=torch.randn(F_, F_),
        ), F_
    return Lam(lambda m, x: torch.einsum("bsf,fg->bsg", x, m.w), w=torch.randn(F_, 3)), 3


@snippet("sdpa")
def _sdpa(rng, F_):
    causal = bool(rng.integers(2))
    return Lam(
        lambda m, x: F.scaled_dot_product_attention(
            x.unsqueeze(1), x.unsqueeze(1), x.unsqueeze(1), is_causal=causal
        ).squeeze(1)
    ), F_


# -- conv / pooling / interpolate ---------------------------------------------------------
@snippet("conv1d")
def _conv1d(rng, F_):
    k = int(rng.integers(1, 4))
    groups = int(rng.choice([g for g in (1, 2, 3) if F_ % g == 0]))
    out = groups * int(rng.integers(1, 3))
    dil = int(rng.integers(1, 3))
    mode = rng.choice(["zeros", "reflect", "replicate", "circular"])
    pad = int(rng.integers(0, 3)) if mode == "zeros" else int(rng.integers(1, 2))
    same = bool(rng.integers(2)) and mode == "zeros"
    stride = int(rng.choice([1, 1, 2]))
    conv = nn.Conv1d(
        F_,
        out,
        k,
        stride=1 if same else stride,
        padding="same" if same else pad,
        dilation=dil,
        groups=groups,
        padding_mode=mode,
    )
    return Lam(lambda m, x: m.mods[0](x.transpose(1, 2)).transpose(1, 2), conv), out


@snippet("conv2d", "any")
def _conv2d(rng, F_):
    k = int(rng.integers(1, 4))
    pad = int(rng.integers(0, 2))
    conv = nn.Conv2d(1, 2, (k, min(k, F_)), padding=(pad, 0), dilation=(int(rng.integers(1, 3)), 1))

    def fn(m, x):
        y = m.mods[0](x.unsqueeze(1))  # [B, 2, S', F']
        return y.permute(0, 2, 1, 3).flatten(2)

    fo = 2 * (F_ - min(k, F_) + 1)
    return Lam(fn, conv), fo


@snippet("conv3d")
def _conv3d(rng, F_):
    conv = nn.Conv3d(1, 1, (1, 1, 1))
    return Lam(lambda m, x: m.mods[0](x.unsqueeze(1).unsqueeze(1)).squeeze(1).squeeze(1), conv), F_


@snippet("pool1d")
def _pool(rng, F_):
    kind = rng.choice(["max", "avg", "adaptive_avg", "adaptive_max", "lp"])
    k = int(rng.integers(1, 4))
    s = int(rng.integers(1, 3))
    p = int(rng.integers(0, k // 2 + 1))
    if kind == "max":
        f = lambda x: F.max_pool1d(x, k, s, p)
    elif kind == "avg":
        cip = bool(rng.integers(2))
        f = lambda x: F.avg_pool1d(x, k, s, p, count_include_pad=cip)
    elif kind == "adaptive_avg":
        f = lambda x: F.adaptive_avg_pool1d(x, 1)
    elif kind == "adaptive_max":
        f = lambda x: F.adaptive_max_pool1d(x, 1)
    else:
        f = lambda x: F.lp_pool1d(x.abs() + 0.1, 2, k, s)
    return Lam(lambda m, x: f(x.transpose(1, 2)).transpose(1, 2)), F_


@snippet("pool_feat")
def _pool_feat(rng, F_):
    if F_ < 2:
        return Lam(lambda m, x: x), F_
    return Lam(lambda m, x: F.max_pool1d(x, 2)), F_ // 2


@snippet("interpolate")
def _interp(rng, F_):
    mode = rng.choice(["nearest", "linear", "linear_ac", "nearest-exact", "size"])
    if mode == "linear_ac":
        f = lambda x: F.interpolate(x, scale_factor=2, mode="linear", align_corners=True)
    elif mode == "size":
        f = lambda x: F.interpolate(x, size=x.shape[-1] * 2 + 1, mode="nearest")
    else:
        f = lambda x: F.interpolate(x, scale_factor=2, mode=mode)
    return Lam(lambda m, x: f(x.transpose(1, 2)).transpose(1, 2)), F_


@snippet("interp_feat")
def _interp_feat(rng, F_):
    mode = rng.choice(["nearest", "linear", "nearest-exact"])
    n = int(rng.integers(1, 2 * F_ + 2))
    return Lam(lambda m, x: F.interpolate(x, size=n, mode=mode)), n


@snippet("interp2d")
def _interp2d(rng, F_):
    mode = rng.choice(["nearest", "bilinear", "bicubic"])
    ac = bool(rng.integers(2)) if mode != "nearest" else None
    return Lam(
        lambda m, x: F.interpolate(
            x.unsqueeze(1), scale_factor=2, mode=mode, align_corners=ac
        ).squeeze(1)[:, :, ::2]
    ), F_


# -- norms -----------------------------------------------------------------------------------
@snippet("norm")
def _norm(rng, F_):
    kind = rng.choice(["ln", "ln_nobias", "gn", "bn", "in", "rms"])
    if kind == "ln":
        return Lam(lambda m, x: m.mods[0](x), nn.LayerNorm(F_)), F_
    if kind == "ln_nobias":
        return Lam(lambda m, x: F.layer_norm(x, (F_,))), F_
    if kind == "rms":
        return Lam(lambda m, x: m.mods[0](x), nn.RMSNorm(F_)), F_
    if kind == "gn":
        g = int(rng.choice([d for d in (1, 2, 3) if F_ % d == 0]))
        return Lam(
            lambda m, x: m.mods[0](x.transpose(1, 2)).transpose(1, 2), nn.GroupNorm(g, F_)
        ), F_
    if kind == "bn":
        bn = nn.BatchNorm1d(F_)
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2)
        return Lam(lambda m, x: m.mods[0](x.transpose(1, 2)).transpose(1, 2), bn), F_
    return Lam(lambda m, x: F.instance_norm(x.transpose(1, 2)).transpose(1, 2)), F_


# -- sort / topk -------------------------------------------------------------------------------
@snippet("topk")
def _topk(rng, F_):
    k = int(rng.integers(1, F_ + 1))
    largest = bool(rng.integers(2))
    kind = rng.choice(["topk_v", "topk_i", "sort_v", "sort_i", "argsort"])
    desc = bool(rng.integers(2))
    if kind == "topk_v":
        return Lam(lambda m, x: x.topk(k, -1, largest=largest).values), k
    if kind == "topk_i":
        return Lam(lambda m, x: x.gather(-1, x.topk(k, -1, largest=largest).indices)), k
    if kind == "sort_v":
        return Lam(lambda m, x: x.sort(-1, descending=desc).values), F_
    if kind == "sort_i":
        return Lam(lambda m, x: x.sort(dim=1, descending=desc, stable=True).indices.float()), F_
    return Lam(lambda m, x: x.gather(-1, x.argsort(-1, descending=desc))), F_


# -- dtype --------------------------------------------------------------------------------------
@snippet("dtype")
def _dtype(rng, F_):
    kind = int(rng.integers(8))
    if kind == 0:
        return Lam(lambda m, x: x.half().float()), F_
    if kind == 1:
        return Lam(lambda m, x: (x.bfloat16() * 2).float()), F_
    if kind == 2:
        return Lam(lambda m, x: (x > 0).int() + x), F_
    if kind == 3:
        return Lam(lambda m, x: ((x * 4).long() // 3).float()), F_
    if kind == 4:
        return Lam(lambda m, x: ((x * 4).int() % 3) * x), F_
    if kind == 5:
        return Lam(lambda m, x: (x > 0) & (x < 1) | (x < -1)).__class__ and Lam(
            lambda m, x: ((x > 0) & (x < 1) | (x < -1)).float() + x
        ), F_
    if kind == 6:
        return Lam(lambda m, x: x + (x * 3).to(torch.int8).float()), F_
    return Lam(lambda m, x: (x.double() * 2).float() + (x > 0).sum(-1, keepdim=True)), F_


# -- creation ---------------------------------------------------------------------------------
@snippet("arange")
def _arange(rng, F_):
    kind = int(rng.integers(6))
    if kind == 0:
        return Lam(lambda m, x: x + torch.arange(x.shape[1]).float()[None, :, None]), F_
    if kind == 1:
        return Lam(lambda m, x: x + torch.full_like(x, 0.5) + torch.zeros_like(x)), F_
    if kind == 2:
        return Lam(lambda m, x: x * x.new_ones(x.shape) + x.new_zeros(1, x.shape[1], 1)), F_
    if kind == 3:
        return Lam(
            lambda m, x: (
                x + torch.arange(0, x.shape[1] * 2, 2, dtype=torch.float32)[None, :, None] * 0.1
            )
        ), F_
    if kind == 4:
        return Lam(lambda m, x: x + torch.linspace(0, 1, x.shape[-1])), F_
    return Lam(lambda m, x: x + torch.full((x.shape[0], 1, 1), 2.0)), F_


@snippet("tril")
def _tril(rng, F_):
    d = int(rng.integers(-1, 2))
    up = bool(rng.integers(2))

    def fn(m, x):
        a = x @ x.transpose(1, 2)
        a = a.triu(d) if up else a.tril(d)
        return a @ x

    return Lam(fn), F_


@snippet("causal_mask")
def _causal(rng, F_):
    def fn(m, x):
        s = x.shape[1]
        mask = torch.ones(s, s, dtype=torch.bool).tril()
        a = (x @ x.transpose(1, 2)).masked_fill(~mask, float("-inf"))
        return a.softmax(-1) @ x

    return Lam(fn), F_


@snippet("pad")
def _pad(rng, F_):
    mode = rng.choice(["constant", "reflect", "replicate", "circular"])
    left, right = int(rng.integers(0, 3)), int(rng.integers(0, 3))
    if mode in ("reflect", "circular"):
        left, right = min(left, 1), min(right, 1)
    pads = (left, right)
    return Lam(lambda m, x: F.pad(x.transpose(1, 2), pads, mode=mode).transpose(1, 2)), F_


@snippet("pad_feat")
def _pad_feat(rng, F_):
    left, right = int(rng.integers(-1, 3)), int(rng.integers(0, 3))
    if F_ + left + right < 1:
        left = 0
    v = float(rng.choice([0.0, 1.5]))
    return Lam(lambda m, x: F.pad(x, (left, right), value=v)), F_ + left + right


@snippet("embedding")
def _emb(rng, F_):
    emb = nn.Embedding(10, F_)

    def fn(m, x):
        ids = (x.abs() * 3).long().clamp(max=9)[..., 0]
        return x + m.mods[0](ids)

    return Lam(fn, emb), F_


@snippet("dropout")
def _dropout(rng, F_):
    return Lam(lambda m, x: m.mods[0](x) * 2, nn.Dropout(0.3)), F_


@snippet("roll")
def _roll(rng, F_):
    s = int(rng.integers(-3, 4))
    return Lam(lambda m, x: torch.roll(x, s, -1)), F_


@snippet("repeat")
def _repeat(rng, F_):
    kind = int(rng.integers(3))
    if kind == 0:
        return Lam(lambda m, x: x.repeat(1, 1, 2)), 2 * F_
    if kind == 1:
        return Lam(lambda m, x: x.repeat_interleave(2, -1)), 2 * F_
    return Lam(lambda m, x: torch.tile(x, (1, 2, 1))[:, ::2]), F_


@snippet("unfold")
def _unfold(rng, F_):
    size = int(rng.integers(1, F_ + 1))
    step = int(rng.integers(1, 3))
    n = (F_ - size) // step + 1
    return Lam(lambda m, x: x.unfold(-1, size, step).sum(-1)), n


# -- more library functions --------------------------------------------------------------------
LIBRARY = {
    "normalize": lambda m, x: F.normalize(x, dim=-1),
    "cosine": lambda m, x: F.cosine_similarity(x, x.flip(-1) + 0.1, dim=-1)[..., None] * x,
    "cdist": lambda m, x: torch.cdist(x, x) @ x * 0.1,
    "outer": lambda m, x: torch.einsum("bsi,bsj->bsij", x, x).sum(-1),
    "diff": lambda m, x: torch.cat([x[..., :1], torch.diff(x, dim=-1)], -1),
    "glu": lambda m, x: F.glu(torch.cat([x, x * 0.5], -1), -1),
    "one_hot": lambda m, x: (
        F.one_hot((x.abs() * 2).long().clamp(max=4)[..., 0], 5).float().sum(-1, keepdim=True) * x
    ),
    "std_mean": lambda m, x: (
        torch.std_mean(x, -1, keepdim=True)[0] + torch.var_mean(x, 1, keepdim=True)[1]
    ),
    "aminmax": lambda m, x: x - torch.aminmax(x, dim=-1, keepdim=True).min,
    "nansum": lambda m, x: torch.nansum(torch.log(x), -1, keepdim=True).nan_to_num() + x,
    "count_nonzero": lambda m, x: torch.count_nonzero(x > 0, -1)[..., None] * x,
    "kthvalue": lambda m, x: x - x.kthvalue(1, -1, keepdim=True).values,
    "softmin": lambda m, x: F.softmin(x, -1),
    "lerp_t": lambda m, x: torch.lerp(x, x.flip(1), torch.sigmoid(x)),
    "addmm": lambda m, x: torch.addmm(x.flatten(0, 1), x.flatten(0, 1), m.w).view_as(x),
    "rot90": lambda m, x: (
        torch.rot90(x[:, :1].expand(-1, x.shape[2], -1), 1, (1, 2)).sum(1, keepdim=True) + x
    ),
    "hardtanh_range": lambda m, x: F.hardtanh(x, -0.3, 0.6),
    "clamp_tensor": lambda m, x: torch.clamp(x, min=x.mean(-1, keepdim=True)),
    "logaddexp": lambda m, x: torch.logaddexp(x, x.flip(-1)),
    "hypot": lambda m, x: torch.hypot(x, x.flip(-1)),
    "cumsum_rev": lambda m, x: x.flip(1).cumsum(1).flip(1),
    "masked_select_sum": lambda m, x: (
        torch.where(x > 0, x, torch.zeros_like(x)).sum(-1, keepdim=True) + x
    ),
    "mha": lambda m, x: m.mods[0](x, x, x, need_weights=False)[0],
    "encoder_layer": lambda m, x: m.mods[1](x),
    "pixel_shuffle": lambda m, x: (
        F.pixel_shuffle(x.unsqueeze(-1).repeat(1, 1, 1, 4), 2)
        .mean((-1, -2))[..., None]
        .expand_as(x)
        + x
        if False
        else x
    ),
    "bucketize": lambda m, x: torch.bucketize(x, m.edges).float(),
    "searchsorted": lambda m, x: torch.searchsorted(m.edges, x.contiguous()).float(),
    "log_softmax_f64": lambda m, x: F.log_softmax(x.double(), -1).float(),
    "silu_half": lambda m, x: F.silu(x.half()).float(),
    "layer_norm_bf16": lambda m, x: F.layer_norm(x.bfloat16(), (x.shape[-1],)).float(),
    "matmul_half": lambda m, x: (x.half() @ x.half().transpose(1, 2)).float() @ x,
}


@snippet("library")
def _library(rng, F_):
    name = str(rng.choice(list(LIBRARY)))
    fn = LIBRARY[name]
    heads = 1
    mha = nn.MultiheadAttention(F_, heads, batch_first=True)
    enc = nn.TransformerEncoderLayer(F_, heads, 2 * F_, dropout=0.0, batch_first=True)
    return Lam(fn, mha, enc, w=torch.randn(F_, F_), edges=torch.tensor([-1.0, 0.0, 0.5])), F_
