"""The built-in model registry: every name builds a graph, typos list the known names."""
import pytest

import braze as bz
from braze.models import BUILTIN_MODELS, build_model


def test_every_builtin_model_builds_a_graph_with_one_output():
    assert set(BUILTIN_MODELS) == {"bert-base", "bert-tiny", "gpt2", "gpt2-small",
                                   "llama-small", "llama-tiny", "resnet-block"}
    for name in BUILTIN_MODELS:
        g = build_model(name)
        assert isinstance(g, bz.Graph) and len(g.outputs) == 1
        assert g.weights == {}


def test_registry_sizes():
    assert build_model("gpt2-small").inputs[0].op.shape.dims == (1, 128, 768)
    assert build_model("gpt2-small").op_counts()["attention"] == 12
    assert build_model("gpt2").inputs[0].op.shape.dims == (2, 8, 64)
    assert build_model("resnet-block").op_counts()["conv2d"] == 2


def test_unknown_model_name_lists_known_names():
    with pytest.raises(bz.GraphError, match="bert-tiny.*llama-small"):
        build_model("bert-tinny")
