"""Canonicalization: recognize logical ops written in primitives (LayerNorm, RMSNorm, GELU and
the other activations, linear layers, RoPE, attention, gated MLPs) so that one set of fusions
serves every frontend. `bz.fuse` runs `canonicalize_passes()` before the fusions.

Each recognizer is a file of rules (pattern + named checks + replacement, as in fusion/) with
its own tests; this module only fixes their order."""
from __future__ import annotations

from ..base import Pass

__all__ = ["canonicalize_passes"]


def canonicalize_passes(options=None) -> list[Pass]:
    """The canonicalization passes in order: cleanups that expose patterns first, then the
    recognizers whose results later ones match (norms and activations before attention)."""
    from ..base import RulePass
    from ..cleanup import CSE_PASS, DCE_PASS
    from .activations import CANONICALIZE_ACTIVATION
    from .attention import CANONICALIZE_ATTENTION, FOLD_REPEAT_KV
    from .attention_input_scale import FOLD_INPUT_SCALE
    from .attention_mask import RECOGNIZE_CAUSAL_MASK
    from .fused_qkv import SELECT_QKV_COLUMNS
    from .heads import HEAD_LAYOUT_RULES
    from .layout import LAYOUT_RULES
    from .norms import CANONICALIZE_NORM
    from .rope import CANONICALIZE_ROPE, MERGE_PARTIAL_ROPE
    from .simplify import AlgebraicSimplify  # simplify cleanups (helper-3)

    return [
        AlgebraicSimplify(),  # x*1, x+0, double casts, the sdpa isnan guard, ... (+ DCE)
        RulePass("CanonicalizeLayout", LAYOUT_RULES),
        RulePass("CanonicalizeNormsAndActivations", (CANONICALIZE_NORM,
                                                     CANONICALIZE_ACTIVATION)),
        RulePass("CanonicalizeRope", (CANONICALIZE_ROPE,)),
        RulePass("MergePartialRope", (MERGE_PARTIAL_ROPE,)),
        CSE_PASS,  # q and k read one half table
        RulePass("CanonicalizeAttention", (CANONICALIZE_ATTENTION,)),
        RulePass("CanonicalizeAttentionLayout", LAYOUT_RULES + HEAD_LAYOUT_RULES + (
            FOLD_REPEAT_KV, FOLD_INPUT_SCALE, SELECT_QKV_COLUMNS)),
        RulePass("RecognizeCausalMask", (RECOGNIZE_CAUSAL_MASK,)),
        CSE_PASS,  # q and k rope tables transposed alike are one value
        AlgebraicSimplify("AlgebraicSimplifyAgain"),  # what the recognizers left (+ DCE)
        DCE_PASS,
    ]
