"""Every pass of `bz.fuse`'s pipelines returns the very graph it was given when it changes
nothing (the passes after it then skip work by identity, and the report's `changed` flags are
exact): checked on builder models before fusion and on their fused graphs fused again."""
import pytest

from braze.models import bert_tiny, gpt2_blocks, llama_tiny, resnet_basic_block
from braze.passes.pipeline import compile_pipeline

MODELS = {"bert": bert_tiny, "gpt2": lambda: gpt2_blocks(layers=1),
          "llama": llama_tiny, "resnet": resnet_basic_block}


def _check(results, g) -> int:
    unchanged = 0
    cur = g
    for r in results:
        assert r.changed == (r.graph is not cur), r.name
        unchanged += not r.changed
        cur = r.graph
    return unchanged


@pytest.mark.parametrize("target", ["cpu", "onnxruntime"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_pass_that_changes_nothing_returns_its_input(model, target):
    g = MODELS[model]()
    pipeline = compile_pipeline(target)
    fused, results, _ = pipeline.run_traced(g)
    assert any(r.changed for r in results)
    _check(results, g)
    again, results2, _ = pipeline.run_traced(fused)
    assert _check(results2, fused) >= len(results2) - 3  # re-fusing finds (almost) nothing
    assert again.op_counts() == fused.op_counts()
