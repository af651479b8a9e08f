"""Builder methods for attention and rope."""
from __future__ import annotations

from ...errors import GraphError
from ..op import Value
from ..ops.attention import Attention, MaskKind, Rope


def _mask_kind(kind) -> MaskKind:
    if isinstance(kind, MaskKind):
        return kind
    try:
        return MaskKind(kind)
    except ValueError:
        names = ", ".join(m.value for m in MaskKind)
        raise GraphError(f"unknown attention mask kind {kind!r}; known: {names}") from None


class AttentionBuilder:
    def attention(self, q: Value, k: Value, v: Value, mask: Value | None = None, *,
                  kind: MaskKind | str | None = None, window: int = 0,
                  scale: float | None = None, softcap: float | None = None) -> Value:
        """Scaled dot-product attention, q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D].

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
        ins = (q, k, v) if mask is None else (q, k, v, mask)
        return self.add_node(op, ins)[0]

    def attention_causal(self, q: Value, k: Value, v: Value, **kw) -> Value:
        """Causal attention (query i sees keys j <= i + Sk - Sq)."""
        return self.attention(q, k, v, kind=MaskKind.CAUSAL, **kw)

    def attention_bias(self, q: Value, k: Value, v: Value, bias: Value, **kw) -> Value:
        """Attention with an additive score bias (ALiBi, relative position bias)."""
        return self.attention(q, k, v, bias, kind=MaskKind.BIAS, **kw)

    def attention_(self, q: Value, k: Value, v: Value, causal: bool = False) -> Value:
        """Short form: plain or causal attention with the default scale."""
        return self.attention(q, k, v, kind=MaskKind.CAUSAL if causal else MaskKind.NONE)

    def rope(self, x: Value, cos: Value, sin: Value, interleaved: bool = False,
             n_rot: int | None = None) -> Value:
        """Rotary embedding of x [..., S, D] with cos/sin [S, n_rot // 2] (see `rope_tables`)."""
        op = Rope(bool(interleaved), None if n_rot is None else int(n_rot))
        return self.add_node(op, (x, cos, sin))[0]

    def rope_n(self, x: Value, cos: Value, sin: Value, n_rot: int) -> Value:
        """Partial rotary embedding of the first `n_rot` dims (rotate-half)."""
        return self.rope(x, cos, sin, n_rot=n_rot)
