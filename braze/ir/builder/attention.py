"""Builder methods for attention and rope, with RLX's attention family: `attention` (custom mask),
`attention_opts`, `attention_kind`, `attention_kind_opts`, `attention_bias` and `attention_`.

braze's attention reads heads-first q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D]. RLX's builders also
take `num_heads`, `head_dim` and an output `shape`; here they are optional: with heads-first
inputs they are checked against the shapes, and with packed inputs q [B, Sq, Hq*D], k/v
[B, Sk, Hkv*D] (`num_heads` required) the builder splits the heads (reshape + transpose), runs
attention and merges them back to [B, Sq, Hq*Dv], the layout a model builder writes by hand, so
the same fusions apply. A given `shape` must equal the inferred output type."""
from __future__ import annotations

from ...errors import GraphError, ShapeError
from ..op import Value
from ..ops.attention import Attention, MaskKind, Rope
from .rlx_args import check_shape


def _mask_kind(kind) -> MaskKind:
    if isinstance(kind, MaskKind):
        return kind
    try:
        return MaskKind(kind)
    except ValueError:
        names = ", ".join(m.value for m in MaskKind)
        raise GraphError(f"unknown attention mask kind {kind!r}; known: {names}") from None


def _count(what: str, name: str, v) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        hint = "; pass the mask kind as mask_kind=..." if isinstance(v, (str, MaskKind)) else ""
        raise GraphError(f"{what}: {name} must be a positive int, got {v!r}{hint}")
    return v


class AttentionBuilder:
    def attention(self, q: Value, k: Value, v: Value, mask: Value | None = None,
                  num_heads: int | None = None, head_dim: int | None = None, shape=None, *,
                  kind: MaskKind | str | None = None, window: int = 0,
                  scale: float | None = None, softcap: float | None = None) -> Value:
        """Scaled dot-product attention, q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D] (or packed
        [B, S, H*D] with `num_heads`, see the module docstring).

        `kind` defaults to "custom" when `mask` (an additive tensor broadcastable to
        [B, Hq, Sq, Sk]) is given, else "none"; "bias" takes the same input (e.g. ALiBi);
        "causal" and "sliding_window" (with `window`) take none."""
        mk = _mask_kind(kind) if kind is not None else (
            MaskKind.CUSTOM if mask is not None else MaskKind.NONE)
        if mk.takes_input and mask is None:
            raise GraphError(f"attention kind {mk.value!r} needs a mask/bias input")
        if mask is not None and not mk.takes_input:
            raise GraphError(f"attention kind {mk.value!r} takes no mask input; use kind="
                             "'custom' or 'bias' to add one")
        op = Attention(mk, int(window), None if scale is None else float(scale),
                       None if softcap is None else float(softcap))
        num_heads = _count("attention", "num_heads", num_heads)
        head_dim = _count("attention", "head_dim", head_dim)
        if self.shape_of(q).rank == 3:
            out = self._packed_attention(op, q, k, v, mask, num_heads, head_dim)
        else:
            self._check_heads(q, num_heads, head_dim)
            out = self.add_node(op, (q, k, v) if mask is None else (q, k, v, mask))[0]
        check_shape(f"attention ({mk.value})", self.shape_of(out), shape)
        return out

    def attention_opts(self, q: Value, k: Value, v: Value, mask: Value | None,
                       num_heads: int | None = None, head_dim: int | None = None, shape=None,
                       score_scale: float | None = None,
                       attn_logit_softcap: float | None = None) -> Value:
        """RLX's `attention_opts`: custom-mask attention with an optional score scale and
        logit softcap (`c * tanh(s / c)`)."""
        return self.attention(q, k, v, mask, num_heads, head_dim, shape, scale=score_scale,
                              softcap=attn_logit_softcap)

    def attention_kind(self, q: Value, k: Value, v: Value, num_heads: int | None = None,
                       head_dim: int | None = None, mask_kind: MaskKind | str = MaskKind.NONE,
                       shape=None, *, window: int = 0) -> Value:
        """RLX's `attention_kind`: attention with a mask the kernel makes itself ("none",
        "causal", or "sliding_window" with `window` keys); q, k, v only."""
        return self.attention_kind_opts(q, k, v, num_heads, head_dim, mask_kind, shape,
                                        window=window)

    def attention_kind_opts(self, q: Value, k: Value, v: Value, num_heads: int | None = None,
                            head_dim: int | None = None,
                            mask_kind: MaskKind | str = MaskKind.NONE, shape=None,
                            score_scale: float | None = None,
                            attn_logit_softcap: float | None = None, *,
                            window: int = 0) -> Value:
        """`attention_kind` with an optional score scale and logit softcap."""
        mk = _mask_kind(mask_kind)
        if mk.takes_input:
            raise GraphError(f"attention_kind takes no mask tensor, so mask kind {mk.value!r} "
                             "does not fit; use attention(q, k, v, mask) for a custom mask or "
                             "attention_bias(q, k, v, bias)")
        return self.attention(q, k, v, None, num_heads, head_dim, shape, kind=mk,
                              window=window, scale=score_scale, softcap=attn_logit_softcap)

    def attention_causal(self, q: Value, k: Value, v: Value, **kw) -> Value:
        """Causal attention (query i sees keys j <= i + Sk - Sq)."""
        return self.attention(q, k, v, kind=MaskKind.CAUSAL, **kw)

    def attention_bias(self, q: Value, k: Value, v: Value, bias: Value,
                       num_heads: int | None = None, head_dim: int | None = None, shape=None,
                       **kw) -> Value:
        """Attention with an additive score bias (ALiBi, relative position bias)."""
        return self.attention(q, k, v, bias, num_heads, head_dim, shape, kind=MaskKind.BIAS,
                              **kw)

    def attention_(self, q: Value, k: Value, v: Value, mask: Value | None = None,
                   num_heads: int | None = None, head_dim: int | None = None, *,
                   causal: bool = False) -> Value:
        """Short form: RLX's `attention_(q, k, v, mask, num_heads, head_dim)` (custom mask), or
        plain / `causal=True` attention without a mask, with the default scale."""
        if mask is not None:
            if causal:
                raise GraphError("attention_: give a mask or causal=True, not both")
            return self.attention(q, k, v, mask, num_heads, head_dim)
        kind = MaskKind.CAUSAL if causal else MaskKind.NONE
        return self.attention(q, k, v, None, num_heads, head_dim, kind=kind)

    # -- packed [B, S, H*D] layout ---------------------------------------------------------------
    def _check_heads(self, q: Value, num_heads: int | None, head_dim: int | None) -> None:
        dims = self.shape_of(q).dims
        if len(dims) != 4:
            return  # the op's inference names the rank problem
        for name, want, have in (("num_heads", num_heads, dims[1]),
                                 ("head_dim", head_dim, dims[3])):
            if want is not None and want != have:
                raise ShapeError(f"attention: {name}={want} but q {self.shape_of(q)} "
                                 f"([B, H, S, D]) has {have}")

    def _packed_attention(self, op: Attention, q: Value, k: Value, v: Value,
                          mask: Value | None, num_heads: int | None,
                          head_dim: int | None) -> Value:
        qs = self.shape_of(q)
        if num_heads is None:
            raise GraphError(f"attention on packed q {qs} ([B, S, H*D]) needs num_heads to "
                             "split the heads; or pass q as [B, H, S, D]")
        hidden = qs.dims[2]
        if not isinstance(hidden, int) or hidden % num_heads:
            raise ShapeError(f"attention: packed q {qs} has {hidden} features, which "
                             f"num_heads={num_heads} does not divide")
        d = hidden // num_heads
        if head_dim is not None and head_dim != d:
            raise ShapeError(f"attention: packed q {qs} with num_heads={num_heads} has head dim "
                             f"{d}, not head_dim={head_dim}")
        kv_heads = self._packed_heads("k", k, d)
        vd = self.shape_of(v).dims[-1]
        if self.shape_of(v).rank != 3 or not isinstance(vd, int) or vd % kv_heads:
            raise ShapeError(f"attention: packed v {self.shape_of(v)} does not split into "
                             f"{kv_heads} kv heads")
        heads = [self._split_heads(x, h, dd) for x, h, dd in
                 ((q, num_heads, d), (k, kv_heads, d), (v, kv_heads, vd // kv_heads))]
        o = self.add_node(op, tuple(heads) if mask is None else (*heads, mask))[0]
        b, h, s, dv = self.shape_of(o).dims
        return self.reshape(self.transpose(o, (0, 2, 1, 3)), (b, s, h * dv))

    def _packed_heads(self, name: str, x: Value, d: int) -> int:
        xs = self.shape_of(x)
        last = xs.dims[-1] if xs.rank else None
        if xs.rank != 3 or not isinstance(last, int) or last % d:
            raise ShapeError(f"attention: packed {name} {xs} does not split into heads of "
                             f"{d} (q's head dim); packed inputs are [B, S, H*D]")
        return last // d

    def _split_heads(self, x: Value, heads: int, d: int) -> Value:
        b, s, _ = self.shape_of(x).dims
        return self.transpose(self.reshape(x, (b, s, heads, d)), (0, 2, 1, 3))

    def rope(self, x: Value, cos: Value, sin: Value, interleaved: bool = False,
             n_rot: int | None = None) -> Value:
        """Rotary embedding of x [..., S, D] with cos/sin [S, n_rot // 2] (see `rope_tables`).

        RLX's `rope(x, cos, sin, head_dim)` works too: an int (not a bool) in the fourth place is
        the head dim, checked against x's last dim, or splitting packed x [B, S, H*D] into heads
        (rotated per head, merged back)."""
        if isinstance(interleaved, int) and not isinstance(interleaved, bool):
            return self._rope_heads(x, cos, sin, interleaved, n_rot)
        op = Rope(bool(interleaved), None if n_rot is None else int(n_rot))
        return self.add_node(op, (x, cos, sin))[0]

    def rope_n(self, x: Value, cos: Value, sin: Value, n_rot: int,
               rlx_n_rot: int | None = None) -> Value:
        """Partial rotary embedding of the first `n_rot` dims (rotate-half). RLX's
        `rope_n(x, cos, sin, head_dim, n_rot)` works too."""
        if rlx_n_rot is not None:
            return self._rope_heads(x, cos, sin, n_rot, rlx_n_rot)
        return self.rope(x, cos, sin, n_rot=n_rot)

    def _rope_heads(self, x: Value, cos: Value, sin: Value, head_dim: int,
                    n_rot: int | None) -> Value:
        head_dim = _count("rope", "head_dim", head_dim)
        xs = self.shape_of(x)
        last = xs.dims[-1] if xs.rank else None
        if last == head_dim:
            return self.rope(x, cos, sin, n_rot=n_rot)
        if xs.rank != 3 or not isinstance(last, int) or last % head_dim:
            raise ShapeError(f"rope: x {xs} is neither [..., S, head_dim={head_dim}] nor packed "
                             f"[B, S, H*{head_dim}]")
        b, s, _ = xs.dims
        heads = self._split_heads(x, last // head_dim, head_dim)
        y = self.rope(heads, cos, sin, n_rot=n_rot)
        return self.reshape(self.transpose(y, (0, 2, 1, 3)), (b, s, last))
