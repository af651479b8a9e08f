"""`bz.import_torch` of nn.LSTM / nn.GRU / nn.RNN and torch.eye: torch.export unrolls the
recurrent layers step by step into ops braze imports (single and stacked layers,
bidirectional, batch_first, given initial states, LSTM projections, relu RNNs, a dynamic
batch), each checked through the interpreter and the compiled CPU executor against PyTorch.
A sequence dim named dynamic is refused with an error that names the recurrent module (the
unrolled loop fixes the length); torch.eye keeps dynamic dims."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

SEQ, BATCH, IN, HID = 3, 3, 4, 5


class WithState(nn.Module):
    """A recurrent layer called with explicit initial states."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, h0, c0=None):
        return self.rnn(x, h0 if c0 is None else (h0, c0))


def _flat(y) -> list[np.ndarray]:
    out = []
    for t in y if isinstance(y, (tuple, list)) else (y,):
        out += _flat(t) if isinstance(t, (tuple, list)) else [t.detach().numpy()]
    return out


def _check(module, args, *, dynamic_shapes=None, runs=None):
    """Import at `args`; interpret and run compiled at `args` (and every tuple in `runs`)."""
    module = module.eval()
    torch.manual_seed(0)
    g = bz.import_torch(module, tuple(torch.from_numpy(a) for a in args),
                        dynamic_shapes=dynamic_shapes)
    names = [n.op.name for n in g.inputs]
    exe = bz.compile(g, "cpu")
    for arrays in [args] + list(runs or []):
        with torch.no_grad():
            want = _flat(module(*(torch.from_numpy(a) for a in arrays)))
        feeds = dict(zip(names, arrays))
        for how, got in (("interpret", bz.interpret(g, feeds)), ("compiled", exe(feeds))):
            assert len(got) == len(want), how
            for a, b in zip(got, want):
                assert a.shape == b.shape, (how, a.shape, b.shape)
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=how)
    return g


def _x(*dims, seed=0):
    return np.random.default_rng(seed).standard_normal(dims).astype(np.float32)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("layers, bidirectional, batch_first", [(1, False, False),
                                                                 (2, True, True)])
def test_recurrent_layers_match_pytorch(cls, layers, bidirectional, batch_first):
    torch.manual_seed(1)
    m = cls(IN, HID, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
    x = _x(BATCH, SEQ, IN) if batch_first else _x(SEQ, BATCH, IN)
    _check(m, (x,))


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_given_initial_states(cls):
    torch.manual_seed(2)
    m = WithState(cls(IN, HID, num_layers=2, bidirectional=True))
    states = [_x(4, BATCH, HID, seed=s) for s in (1, 2)][:2 if cls is nn.LSTM else 1]
    _check(m, (_x(SEQ, BATCH, IN), *states))


def test_lstm_with_projections_and_a_relu_rnn_without_bias():
    torch.manual_seed(3)
    _check(nn.LSTM(IN, HID, proj_size=3, num_layers=2), (_x(SEQ, BATCH, IN),))
    _check(nn.RNN(IN, HID, nonlinearity="relu", bias=False), (_x(SEQ, BATCH, IN),))


def test_dynamic_batch_runs_at_every_batch_size():
    torch.manual_seed(4)
    m = nn.GRU(IN, HID, batch_first=True, bidirectional=True)
    g = _check(m, (_x(BATCH, SEQ, IN),), dynamic_shapes={"input": {0: "batch"}},
               runs=[(_x(7, SEQ, IN, seed=5),)])
    assert g.inputs[0].op.shape.dims == ("batch", SEQ, IN)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_a_dynamic_sequence_length_is_refused_naming_the_module(cls):
    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = cls(IN, HID, batch_first=True)

        def forward(self, x):
            return self.enc(x)[0]

    with pytest.raises(FrontendError, match=rf"dim 1 of input 'x' was named 'seq'.*"
                                            rf"nn\.{cls.__name__} 'enc'.*sequence length is "
                                            r"always static"):
        bz.import_torch(Encoder().eval(), (torch.randn(BATCH, SEQ, IN),),
                        dynamic_shapes={"x": {1: "seq"}})


class Eye(nn.Module):
    def forward(self, x):
        n, m = x.shape
        return x + torch.eye(n, m, dtype=x.dtype), torch.eye(n, dtype=torch.int64), \
            torch.eye(3, 5, dtype=torch.bool)


def test_eye_keeps_dynamic_dims():
    g = _check(Eye(), (_x(4, 6),), dynamic_shapes={"x": {0: "n", 1: "m"}},
               runs=[(_x(7, 3, seed=1),)])
    assert g.shape_of(g.outputs[1]).dims == ("n", "n")
