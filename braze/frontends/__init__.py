"""Frontends: importers that translate models node by node into braze ops (ONNX files, PyTorch
modules through torch.export). Source node names / module paths become provenance; recognizing
logical ops is left to canonicalization, so one set of fusions serves every frontend."""
