"""The PyTorch frontend: `import_torch(module, example_inputs, dynamic_shapes)` (through
torch.export), or a saved `.pt2` program / ExportedProgram -> braze Graph. Needs the `torch`
extra."""
from .decompositions import KEPT_OPS, decomposition_table  # noqa: F401
from .exporter import import_torch  # noqa: F401
from .importer import SUPPORTED_OPS, import_program  # noqa: F401
