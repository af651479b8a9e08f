"""FoldConvPad: conv2d(pad(x, zeros on H and W), w[, b]) -> conv2d(x, w[, b]) with the pad
amounts added to the conv's own padding (top, left, bottom, right). Exporters of TF-style
"same" padding write the asymmetric pad as its own Pad node (Hugging Face MobileNet v1 / v2 and
EfficientNet with tf_padding, Keras conversions); the conv then reads a padded copy of its input
that the executor would write and read back every call. Only a zero constant pad of the two
spatial axes folds: another fill value, a reflect or edge pad, or a pad of the batch or channel
axis is a near miss with the reason."""
from __future__ import annotations

from ...ir.ops.shape import PadMode
from ...rewrite import Miss, MissReason, P, Rule, V, fail
from .checks import target_claims

_padded = P.pad(V("x"), name="pad")
_pattern = (P.conv2d(_padded, V("w"), name="conv")
            | P.conv2d(_padded, V("w"), V("cb"), name="conv"))


def zero_pad_of_the_image(m, ctx) -> Miss | None:
    """The pad adds zeros, on the height and width axes only (what a conv's padding does)."""
    pad = m.op("pad")
    if pad.mode is not PadMode.CONSTANT or pad.value != 0.0:
        fill = pad.mode.value if pad.mode is not PadMode.CONSTANT else f"the value {pad.value}"
        return fail(MissReason.PATTERN_MISMATCH,
                    detail=f"the pad fills with {fill}; a conv's padding adds zeros")
    if any(pad.pads[axis] != (0, 0) for axis in (0, 1)):
        return fail(MissReason.AXIS_MISMATCH,
                    detail=f"the pad also pads the batch or channel axis {pad.pads[:2]}; a "
                           "conv pads only height and width")
    return None


def _build(b, m):
    conv = m.op("conv")
    (top, bottom), (left, right) = m.op("pad").pads[2:]
    t, lf, bt, r = conv.padding
    bias = m.v("cb") if "cb" in m.values else None
    return b.conv2d(m.v("x"), m.v("w"), bias, conv.stride, (t + top, lf + left, bt + bottom,
                                                             r + right),
                    conv.dilation, conv.groups)


FOLD_CONV_PAD = Rule(
    "FoldConvPad",
    _build,
    pattern=_pattern,
    checks=(target_claims("conv_bn_fold"), zero_pad_of_the_image),
    produces="conv_bn_fold",
)
RULES = (FOLD_CONV_PAD,)
