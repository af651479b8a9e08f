"""torch fake quantization through bz.import_torch: fake_quantize_per_tensor_affine and
fake_quantize_per_channel_affine (ranges inside int8 / uint8) import as braze's fake_quantize with
torch's forward values bit for bit (interpreter and compiled) and torch's straight-through
gradient, as does a default QAT model with its observers off; wider ranges and quantized
tensors are refused naming the node."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.autodiff import grad_with_loss
from braze.errors import FrontendError, UnsupportedOpsError

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")  # deprecated


class PerTensor(torch.nn.Module):
    def __init__(self, lo=-128, hi=127):
        super().__init__()
        self.lo, self.hi = lo, hi

    def forward(self, x):
        return torch.fake_quantize_per_tensor_affine(x, 0.05, 3, self.lo, self.hi) * 2.0


class PerChannel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.01, 0.06, 4))
        self.register_buffer("zp", torch.arange(4, dtype=torch.int32) * 20)

    def forward(self, x):
        return torch.fake_quantize_per_channel_affine(x, self.scale, self.zp, 1, 0, 255)


@pytest.mark.parametrize("module", [PerTensor(), PerTensor(0, 255), PerChannel(),
                                    PerTensor(0, 127), PerTensor(-127, 127), PerTensor(-8, 7)],
                         ids=["per_tensor_int8", "per_tensor_uint8", "per_channel_uint8",
                              "reduce_range_0_127", "symmetric_int8", "int4"])
def test_fake_quantize_imports_with_torchs_values_and_gradient(module):
    x = torch.randn(3, 4, 200) * 3
    g = bz.import_torch(module, (x,))
    assert "fake_quantize" in {n.op.kind for n in g.nodes}
    name = g.inputs[0].op.name
    want = module(x).numpy()
    np.testing.assert_array_equal(bz.interpret(g, {name: x.numpy()})[0], want)
    np.testing.assert_array_equal(bz.compile(g)({name: x.numpy()})[0], want)

    ct = np.random.default_rng(0).normal(size=want.shape).astype(np.float32)
    loss = bz.Graph("loss")
    from braze.autodiff.reverse import clone_into

    out = clone_into(loss, g)[g.outputs[0]]
    loss.set_outputs([loss.sum(loss.mul(out, loss.constant(ct)))])
    got = bz.interpret(grad_with_loss(loss, [name]), {name: x.numpy()})[1]
    t = x.clone().requires_grad_(True)
    module(t).backward(torch.tensor(ct))
    assert 0 < (t.grad == 0).sum() < t.grad.numel()  # saturated and passing elements
    np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-6, atol=1e-7)


class QatLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.fc = torch.nn.Linear(16, 8)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        return self.dequant(torch.relu(self.fc(self.quant(x))))


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:Please use quant_min")
@pytest.mark.parametrize("backend", ["x86", "qnnpack"])
def test_a_default_qat_model_with_its_observers_off_imports_with_torchs_values(backend):
    """torch's default QAT qconfigs fake-quantize through FusedMovingAvgObsFakeQuantize
    (reduce_range 0..127 activations for x86, per-channel weights): with the observers off
    (as for evaluation or export) braze imports it with torch's numbers; with them on it
    refuses, saying how to turn them off."""
    torch.manual_seed(0)
    m = QatLinear().train()
    m.qconfig = torch.ao.quantization.get_default_qat_qconfig(backend)
    torch.ao.quantization.prepare_qat(m, inplace=True)
    for _ in range(3):
        m(torch.randn(4, 16) * 2)
    x = torch.randn(4, 16) * 2
    with pytest.raises(FrontendError, match="observer is on.*disable_observer"):
        bz.import_torch(m, (x,))
    m.apply(torch.ao.quantization.disable_observer)
    g = bz.import_torch(m, (x,))
    assert sum(n.op.kind == "fake_quantize" for n in g.nodes) == 3  # x, weight, output
    want = m(x).detach().numpy()
    name = g.inputs[0].op.name
    np.testing.assert_array_equal(bz.interpret(g, {name: x.numpy()})[0], want)
    np.testing.assert_array_equal(bz.compile(g)({name: x.numpy()})[0], want)


def test_other_ranges_and_quantized_tensors_are_refused_naming_the_node():
    x = torch.randn(2, 8)
    with pytest.raises(FrontendError, match=r"fake_quantize_per_tensor_affine.*\[-8, 300\].*"
                                            r"inside int8"):
        bz.import_torch(PerTensor(-8, 300), (x,))

    class Quantized(torch.nn.Module):
        def forward(self, x):
            return torch.quantize_per_tensor(x, 0.1, 0, torch.qint8).dequantize()

    with pytest.raises(UnsupportedOpsError, match=r"aten.quantize_per_tensor.default \(node "
                                                  r"'quantize_per_tensor'"):
        bz.import_torch(Quantized(), (x,))
