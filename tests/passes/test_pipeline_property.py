"""Property: random valid graphs go through the whole pipeline of every target with the verifier
on after each pass, and fused, unfused and original graphs agree on fresh random inputs."""
import pytest
from hypothesis import HealthCheck, given, settings

import braze as bz
from braze.testing import assert_equivalent, random_graphs


@pytest.mark.parametrize("target", ["cpu", "gpu", "onnxruntime"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=random_graphs(max_nodes=14))
def test_random_graphs_survive_the_pipeline(target, g):
    before = str(g)
    fused, report = bz.fuse(g, target, verify=True)
    assert str(g) == before                       # the input graph is never mutated
    assert_equivalent(g, fused, rtol=1e-4, atol=1e-5)
    plain = bz.unfuse_fused_for_autodiff(fused)
    bz.verify(plain)
    assert not any(n.op.fused for n in plain.nodes)
    assert_equivalent(g, plain, rtol=1e-4, atol=1e-5)
    assert report.nodes_before == sum(1 for n in g.nodes if not n.op.source)


@settings(max_examples=25, deadline=None)
@given(g=random_graphs(max_nodes=14))
def test_gpu_limits_hold_for_every_region(g):
    with bz.with_fusion_limits(max_steps=3, max_inputs=2):
        fused, _ = bz.fuse(g, "gpu")
    for n in fused.nodes:
        if n.op.kind == "elementwise_region":
            assert len(n.op.steps) <= 3 and n.op.n_inputs <= 2
    assert_equivalent(g, fused, rtol=1e-4, atol=1e-5)
