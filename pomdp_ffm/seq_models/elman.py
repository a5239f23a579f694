"""The Elman network (J. L. Elman, 1990, "Finding structure in time", Cognitive Science 14(2)): the simple
recurrent network, one tanh layer whose previous output feeds back into it.

    h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)        y_t = h_t

per layer, each stacked layer taking the one below's h_t as its x_t (``num_layers`` from policy.rnn_num_layers, 1
by default like POPGym's ``num_recurrent_layers``). torch's fused ``nn.RNN`` (tanh) computes it, as POPGym's
``popgym.baselines.ray_models.ray_elman.Elman`` does on its default (non-benchmark) path; its two biases b_ih and
b_hh are nn.RNN's, kept as POPGym trains them.

State: h_{t-1} of every layer, ``[num_layers, B, hidden_size]`` (nn.RNN's layout, batch second, as for GRU; POPGym
keeps it batch first, ``[B, num_layers, hidden_size]``): num_layers * hidden_size floats per batch row. hidden_size
is POPGym's ``hidden_size``, the width of every layer and of the output.

Deliberate difference from POPGym: the initialisation. POPGym leaves nn.RNN's own (every weight and bias uniform in
+-1/sqrt(hidden_size)); here it is rnn.py's for GRU and LSTM, the POMDP-baselines reference's: orthogonal weights,
zero biases. The forward computation is the same (tests/test_zoo_elman_indrnn.py copies POPGym's weights in).
"""

from __future__ import annotations

from torch import nn

from .rnn import TorchRNN


class Elman(TorchRNN):
    """An Elman network of ``num_layers`` tanh layers (torch's ``nn.RNN``), initialised as rnn.py's GRU and LSTM."""

    # Saved per unit of width and layer, counted as GRU's 8 and LSTM's 10 are (two per gate plus two): one gate.
    rnn_cls, activations = nn.RNN, 2
