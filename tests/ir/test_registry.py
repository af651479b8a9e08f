"""Registry completeness: every op kind defines inference and a reference, composite kinds a
decomposition, and every kind can be built, interpreted and (if composite) expanded."""
import inspect

import braze as bz
import braze.models  # noqa: F401
from braze.ir import ops  # noqa: F401  (registers every kind)
from braze.ir.op import OP_REGISTRY, Op


def _overrides(cls, name):
    return any(name in c.__dict__ for c in cls.__mro__ if c is not Op and issubclass(c, Op))


def test_every_kind_has_inference_and_reference():
    missing = []
    for kind, cls in OP_REGISTRY.items():
        if not _overrides(cls, "infer"):
            missing.append(f"{kind}: infer")
        if not cls.source and not cls.composite and not _overrides(cls, "reference"):
            missing.append(f"{kind}: reference")
    assert not missing, missing


def test_every_composite_kind_has_a_decomposition():
    missing = [k for k, c in OP_REGISTRY.items() if c.composite and not _overrides(c, "decompose")]
    assert not missing, missing


def test_every_fused_kind_is_composite():
    assert all(c.composite for c in OP_REGISTRY.values() if c.fused)


def test_registry_covers_the_families_the_design_names():
    want = {"input", "param", "constant", "unary", "binary", "compare", "where", "cast", "matmul",
            "dot_general", "layer_norm", "rms_norm", "group_norm", "batch_norm", "softmax",
            "reduce", "cumsum", "reshape", "transpose", "narrow", "concat", "expand", "gather",
            "pad", "split", "attention", "rope", "conv2d", "conv_transpose2d", "pool2d",
            "global_avg_pool", "resize_nearest_2x", "fused_matmul_bias_act", "fused_swiglu",
            "fused_residual_ln", "fused_residual_rms_norm", "fused_attention_block",
            "fused_transformer_layer", "fused_conv_bias_act", "elementwise_region"}
    assert want <= set(OP_REGISTRY), sorted(want - set(OP_REGISTRY))


def test_op_classes_are_frozen_dataclasses():
    for kind, cls in OP_REGISTRY.items():
        params = getattr(cls, "__dataclass_params__", None)
        assert params is not None and params.frozen, kind
        assert inspect.isclass(cls)


def test_unfuse_expands_every_fused_kind_of_a_fused_model():
    g = bz.models.bert_encoder(layers=1, hidden=32, heads=2, batch=1, seq=4)
    fused, _ = bz.fuse(g, "cpu")
    plain = bz.unfuse_fused_for_autodiff(fused)
    assert not any(n.op.fused for n in plain.nodes)
