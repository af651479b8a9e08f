"""braze: an ML graph compiler built around operator fusion.

    import braze as bz
    g = bz.Graph("m"); x = g.input("x", bz.Shape((2, 8))); ...
"""
from .errors import (  # noqa: F401
    BrazeError,
    FrontendError,
    GraphError,
    InterpretError,
    ParseError,
    PassError,
    ShapeError,
    UnsupportedOpsError,
    VerifyError,
)
from .interpret import init_params, interpret, random_feeds  # noqa: F401
from .ir import (  # noqa: F401
    ALL_DTYPES,
    DType,
    Graph,
    Node,
    Op,
    Shape,
    Value,
    bf16,
    bool_,
    c64,
    f16,
    f32,
    f64,
    i8,
    i16,
    i32,
    i64,
    u8,
    u32,
)
from .ir.ops import BinaryFn, CompareFn, UnaryFn  # noqa: F401
from .ir.serialize import load, save  # noqa: F401
from .ir.verify import verify  # noqa: F401

__version__ = "0.1.0"

# fusion layer (pipeline, report, unfuse, limits) and autodiff
from .autodiff import (  # noqa: E402,F401
    ForceEnergyLossWeights,
    build_force_energy_loss,
    convert_scans_for_ad,
    directional_nth_grad,
    grad_subgraph,
    grad_with_loss,
    hvp,
    inline_custom_fn_for_autodiff,
    jvp,
    nth_order_grad,
    prepare_graph_for_ad,
    vmap,
)
from .passes.base import run_passes  # noqa: E402,F401
from .passes.canonicalize.simplify import simplify  # noqa: E402,F401
from .passes.const_fold import ConstantFolding  # noqa: E402,F401
from .passes.legalize import (  # noqa: E402,F401
    DispatchReport,
    LegalizeError,
    dispatch_report,
    legalize,
    rewrite_for_backend,
)
from .passes.legalize_broadcast import LegalizeBroadcast  # noqa: E402,F401
from .passes.limits import FusionLimits, active_fusion_limits, with_fusion_limits  # noqa: E402,F401
from .passes.lower import (  # noqa: E402,F401
    LowerBatchNormInference,
    LowerControlFlow,
    LowerDotGeneral,
    LowerGroupNorm,
    LowerNonLastAxisReduce,
    LowerResizeNearest2x,
    LowerSoftmaxCrossEntropy,
    inline_if,
    inline_subgraph_into,
    inline_subgraph_into_outputs,
    lower_logical_kernels,
    unroll_while,
)
from .passes.params import promote_params_to_inputs, specialize_params  # noqa: E402,F401
from .passes.pipeline import (  # noqa: E402,F401
    FusionOptions,
    compile_pipeline,
    fuse,
    fusion_passes,
    fusion_passes_for_supported,
)
from .passes.quant import quantize_dynamic  # noqa: E402,F401
from .passes.targets import TARGETS, Target, get_target  # noqa: E402,F401
from .passes.unfuse import unfuse_fused_for_autodiff  # noqa: E402,F401
from .pipeline_inspect import PipelineInspection, inspect_pipeline  # noqa: E402,F401
from .report import FusionReport, MissedFusion, MissReason  # noqa: E402,F401
from .training.clipping import clip_grad_norm  # noqa: E402,F401
from .training.optimizers import SGD, Adam, AdamW  # noqa: E402,F401
from .training.schedules import StepDecay, WarmupCosine, WarmupLinear  # noqa: E402,F401


def import_onnx(model, **kwargs):
    """Import an ONNX model (path, bytes or onnx.ModelProto) as a braze Graph; see
    `braze.frontends.onnx.import_onnx`."""
    from .frontends.onnx import import_onnx as _import

    return _import(model, **kwargs)


def import_torch(model, example_inputs=None, dynamic_shapes=None, **kwargs):
    """Import a PyTorch module (through torch.export), an ExportedProgram or a saved .pt2
    program as a braze Graph; see `braze.frontends.torch.import_torch`."""
    from .frontends.torch import import_torch as _import

    return _import(model, example_inputs, dynamic_shapes, **kwargs)


def compile(graph, target="cpu", **kwargs):  # noqa: A001 - the public name the design gives
    """Compile `graph` into an executable for `target`; see `braze.runtime.compile`."""
    from .runtime import compile as _compile

    return _compile(graph, target, **kwargs)


def compile_training(graph, wrt, optimizer, **kwargs):
    """Compile a training step (forward, backward and optimizer around one weight region); see
    `braze.training.compile_training`."""
    from .training import compile_training as _compile_training

    return _compile_training(graph, wrt, optimizer, **kwargs)


def export_onnx(graph, path, target="onnxruntime", **kwargs):
    """Write `graph` as an ONNX model; see `braze.export.onnx.export_onnx`."""
    from .export.onnx import export_onnx as _export

    return _export(graph, path, target, **kwargs)


def __getattr__(name):
    """`bz.models` (the reference model builders) loads on first use."""
    if name == "models":
        import importlib

        return importlib.import_module(".models", __name__)
    raise AttributeError(f"module 'braze' has no attribute {name!r}")
