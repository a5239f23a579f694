"""Every option section of ``policy``, torch-free: each algorithm's (``policy.sac``, ``policy.td3``) and each
built-in memory's (``policy.<memory>``), with the rules their fields obey. pomdp_ffm.catalog's records name them,
config.py builds the run's schema from them, and analysis reads a run's settings without importing torch. Each
memory's dataclass is the one place of its options' defaults and rules: its model takes them from it
(rules.options_of), and its conf group option (config.register_configs) names only the model."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import List, Optional

from .rules import above, at_least, checked, must, one_of, within

# The sine time embedding's options (pomdp_ffm/seq_models/time_embedding.py), shared by PosMLP, Stack, TCN, FART, FWP.
EMBEDDINGS = ("sine", "none")
DEFAULT_HORIZON = 1024  # POPGym's max_seq_len in its experiments (its ppo.py's bptt_cutoff)
EMBEDDING_RULE = one_of(EMBEDDINGS)
HORIZON_RULE = at_least(1)

ATTENTION_AGGREGATORS = ("sum", "max")  # FART's and FWP's (pomdp_ffm/seq_models/fart.py)
INITS = ("lin", "inv")  # S4D-Lin (POPGym's measure "diag-lin") and S4D-Inv ("diag-inv")
DISCRETISATIONS = ("zoh", "bilinear")
ACTIVATIONS = ("relu", "tanh")  # IndRNN's
_SIZE_OR_NULL = must(lambda v: v is None or v >= 1, "null (derived from policy.rnn_hidden_size) or >= 1")


def fart_width(hidden_size: int) -> int:
    """ray_linear_attention's key/value width h = round(sqrt(H) - 1)."""
    return round(math.sqrt(hidden_size) - 1)


@dataclass
class SACConfig:
    entropy_alpha: float = checked(0.2, at_least(0))  # used only when automatic_entropy_tuning is false
    automatic_entropy_tuning: bool = True
    alpha_lr: float = checked(3e-4, above(0))
    target_entropy: Optional[float] = None  # None: -|A|
    alpha_loss: str = checked("alpha", one_of(("alpha", "log_alpha")))  # the reference's loss (SAC paper: log_alpha)


@dataclass
class TD3Config:
    exploration_noise: float = checked(0.1, at_least(0))
    target_noise: float = checked(0.2, at_least(0))
    target_noise_clip: float = checked(0.5, at_least(0))
    policy_delay: int = checked(1, at_least(1))  # the reference updates the actor at every step (TD3 paper: 2)
    actor_q: str = checked("min", one_of(("min", "q1")))  # the reference's actor maximises min(Q1, Q2) (TD3 paper: q1)


@dataclass
class PosMLPConfig:
    """PosMLP's options, the config section policy.posmlp; defaults are POPGym's."""

    # The sinusoid's frequency base N (POPGym's max_seq_len, 1024 in its experiments); no limit on episode length.
    embedding_horizon: int = checked(DEFAULT_HORIZON, HORIZON_RULE)
    # Mix the input and the code by a learned strength s in [0, 1] (POPGym's scale_embedding); false: x + PE(t).
    scale_embedding: bool = True


@dataclass
class StackConfig:
    """Stack's options, the config section policy.stack; defaults are POPGym's."""

    stack_size: int = checked(4, at_least(1))  # k, which must divide policy.rnn_hidden_size (check_chosen)
    embedding: str = checked("sine", EMBEDDING_RULE)  # POPGym's time embedding on its input, or "none"
    embedding_horizon: int = checked(DEFAULT_HORIZON, HORIZON_RULE)  # the sinusoid's frequency base (max_seq_len)
    scale_embedding: bool = True  # mix input and code by a learned strength in [0, 1] (POPGym's scale_embedding)

    def check_chosen(self, key: str, policy) -> None:
        h, k = policy.rnn_hidden_size, self.stack_size
        if h % k:
            raise ValueError(
                f"policy.rnn_hidden_size={h} must be a multiple of {key}.stack_size={k} with policy.seq_model=stack "
                f"(its {k} frames of h / k compressed features fill the MLP's input of h)"
            )


@dataclass
class TCNConfig:
    """TCN's options, the config section policy.tcn; defaults are POPGym's."""

    stack_size: int = checked(4, at_least(1))  # k, the kernel's extent in steps
    embedding: str = checked("sine", EMBEDDING_RULE)  # POPGym's time embedding on its input, or "none"
    embedding_horizon: int = checked(DEFAULT_HORIZON, HORIZON_RULE)  # the sinusoid's frequency base (max_seq_len)
    scale_embedding: bool = True  # mix input and code by a learned strength in [0, 1] (POPGym's scale_embedding)


@dataclass
class FWPConfig:
    """FWP's options, the config section policy.fwp; defaults are POPGym's ray_fwp
    MODEL_CONFIG and BaseModel BASE_CONFIG (and its experiments' max_seq_len for the horizon)."""

    embedding: str = checked("sine", EMBEDDING_RULE)
    embedding_horizon: int = checked(DEFAULT_HORIZON, HORIZON_RULE)
    scale_embedding: bool = True
    aggregator: str = checked("sum", one_of(ATTENTION_AGGREGATORS))  # W_t = W_{t-1} + v_t k_t^T; max: running max
    sum_normalization: bool = True  # k and q divided by their sums (the paper's sum normalisation)


@dataclass
class FARTConfig:
    """FART's options, the config section policy.fart; defaults are POPGym's
    ray_linear_attention MODEL_CONFIG and BaseModel BASE_CONFIG (and its experiments' max_seq_len for the horizon)."""

    embedding: str = checked("sine", EMBEDDING_RULE)
    embedding_horizon: int = checked(DEFAULT_HORIZON, HORIZON_RULE)
    scale_embedding: bool = True
    s_aggregator: str = checked("sum", one_of(ATTENTION_AGGREGATORS))  # S_t = S_{t-1} + k_t v_t^T; max: running max
    z_aggregator: str = checked("sum", one_of(ATTENTION_AGGREGATORS))  # z_t = z_{t-1} + k_t, the normaliser

    def check_chosen(self, key: str, policy) -> None:
        h = policy.rnn_hidden_size
        if fart_width(h) < 1:
            raise ValueError(
                f"policy.rnn_hidden_size={h} must be >= 3 with policy.seq_model=fart (its key/value width "
                f"round(sqrt(h) - 1) = {fart_width(h)} must be >= 1)"
            )


@dataclass
class S4DConfig:
    """S4D's options, the config section policy.s4d. POPGym's MODEL_CONFIG for S4D holds
    only ``embedding: None`` (none here either); these defaults are the values ray_s4d.py passes to its S4 layer
    and that layer's own defaults."""

    # The paper's N (real state size): d_state / 2 complex modes per feature; null: POPGym's round(sqrt(h) / 2) * 2
    d_state: int | None = checked(None, must(lambda v: v is None or (v >= 2 and v % 2 == 0), "null or even >= 2"))
    # The step sizes dt start log-uniform in [dt_min, dt_max]; dt_min <= dt_max (check_together)
    dt_min: float = checked(0.001, above(0))
    dt_max: float = checked(0.1, above(0))
    # A's initial eigenvalues: lin (S4D-Lin, -1/2 + i pi n, POPGym's) or inv (S4D-Inv)
    init: str = checked("lin", one_of(INITS))
    disc: str = checked("zoh", one_of(DISCRETISATIONS))  # zoh (zero-order hold, POPGym's) or bilinear

    def check_together(self, key: str) -> None:
        if self.dt_max < self.dt_min:
            raise ValueError(f"{key}.dt_max={self.dt_max!r} must be >= {key}.dt_min={self.dt_min!r}")


@dataclass
class LMUConfig:
    """LMU's options, the config section policy.lmu; defaults are POPGym's ray_lmu
    MODEL_CONFIG (memory_size None: hidden_size, as ray_lmu sets it)."""

    memory_size: Optional[int] = checked(None, must(lambda v: v is None or v >= 1, "null (= hidden size) or >= 1"))
    theta: float = checked(64, above(0))  # the sliding window, in steps, the memory's delay system represents
    learn_a: bool = False  # train the discretised A (otherwise a fixed buffer)
    learn_b: bool = False  # train the discretised B (otherwise a fixed buffer)


@dataclass
class IndRNNConfig:
    """IndRNN's options, the config section policy.indrnn."""

    # ReLU: what POPGym's core computes (its MODEL_CONFIG's "tanh" reaches nothing; module docstring)
    activation: str = checked("relu", one_of(ACTIVATIONS))
    recurrent_bound: bool = True  # POPGym's clamp
    # |u| <= 2^(1 / bound_horizon): POPGym's max_len, RLlib's max_seq_len (1024 in its experiments), in steps
    bound_horizon: int = checked(1024, at_least(1))


@dataclass
class DNCConfig:
    """The DNC's options, the config section policy.dnc; defaults are POPGym's DiffNC
    MODEL_CONFIG (nr_cells: its hidden_size // cell_size)."""

    cell_size: int = checked(16, at_least(1))  # W, the width of a memory cell
    read_heads: int = checked(4, at_least(1))  # R
    nr_cells: Optional[int] = checked(
        None, must(lambda v: v is None or v >= 1, "null (policy.rnn_hidden_size // cell_size) or >= 1")
    )  # N
    num_hidden_layers: int = checked(1, at_least(1))  # the LSTM controller's stacked layers

    def check_chosen(self, key: str, policy) -> None:
        h = policy.rnn_hidden_size
        if self.nr_cells is None and h < self.cell_size:
            raise ValueError(
                f"policy.rnn_hidden_size={h} must be >= {key}.cell_size={self.cell_size} with policy.seq_model=dnc "
                f"and {key}.nr_cells=null (the memory has hidden_size // cell_size cells); or set {key}.nr_cells"
            )


@dataclass
class LRUConfig:
    """The LRU's options, the config section policy.lru; the defaults are the paper's
    appendix code's (POPGym has no LRU)."""

    # N, the complex state's size; null: hidden_size
    state_size: Optional[int] = checked(None, _SIZE_OR_NULL)
    r_min: float = checked(0.0, within(0, 1))  # <= r_max (check_together)
    r_max: float = checked(1.0, within(0, 1))
    max_phase: float = checked(2 * math.pi, above(0))  # phases uniform in [0, max_phase] (pi / 10 for the PathX task)

    def check_together(self, key: str) -> None:
        if self.r_min > self.r_max:
            raise ValueError(f"{key}.r_min={self.r_min!r} must be <= {key}.r_max={self.r_max!r}")


def up_projection(hidden_size: int, proj_factor: float) -> int:
    """xLSTM's up-projection width (its UpProjConfigMixin's), for mLSTM's block and sLSTM's feed-forward."""
    return 64 * math.ceil(proj_factor * hidden_size / 64)


class _OverHeads:
    """The check of an options section whose memory splits its width, policy.rnn_hidden_size, over ``heads``."""

    def check_chosen(self, key: str, policy) -> None:
        h, n = policy.rnn_hidden_size, self.heads
        if h % n:
            raise ValueError(
                f"policy.rnn_hidden_size={h} must be a multiple of {key}.heads={n} with "
                f"policy.seq_model={key.rpartition('.')[2]} (each head takes h / heads of the width)"
            )


@dataclass
class TransformerConfig(_OverHeads):
    """The causal Transformer's options, the config section policy.transformer (pomdp_ffm/seq_models/transformer.py):
    GPT-2 blocks of width policy.rnn_hidden_size."""

    layers: int = checked(2, at_least(1))  # GPT-2 blocks
    heads: int = checked(4, at_least(1))  # attention heads, which must divide policy.rnn_hidden_size (check_chosen)
    # K, the steps each step attends to (itself included): acting keeps the last K steps' keys and values per layer.
    # 64: the BLT tasks' training windows (train.sampled_seq_len), so that a window attends to all of itself.
    context: int = checked(64, at_least(1))


@dataclass
class GTrXLConfig(_OverHeads):
    """GTrXL's options, the config section policy.gtrxl (pomdp_ffm/seq_models/gtrxl.py): gated Transformer-XL blocks
    of width policy.rnn_hidden_size. Layers, heads and memory are the project Transformer's (policy.transformer), so
    that the two attention memories compare at one size; the gate bias is the paper's."""

    layers: int = checked(2, at_least(1))  # GTrXL blocks
    heads: int = checked(4, at_least(1))  # attention heads, which must divide policy.rnn_hidden_size (check_chosen)
    # M, the previous steps' hidden states each step attends to besides itself (Transformer-XL's memory length):
    # acting keeps the last M layer inputs per layer. 64: the BLT tasks' training windows (train.sampled_seq_len).
    memory: int = checked(64, at_least(1))
    # b_g, the update gate's bias at initialisation (then learned): z = sigmoid(... - b_g), so b_g > 0 starts each
    # gate near the identity (the paper's 2); 0 is a plain GRU gate.
    gate_bias: float = checked(2.0, at_least(0))


@dataclass
class MambaConfig:
    """Mamba's options, the config section policy.mamba (pomdp_ffm/seq_models/mamba.py): residual Mamba blocks of
    width policy.rnn_hidden_size. Defaults: mambapy 1.2.0's MambaConfig (mambapy/mamba.py), its field names but
    ``expand`` (its expand_factor) and ``layers`` (its n_layers, which has no default)."""

    # Residual blocks (RMSNorm, Mamba block, skip): 1, as the other recurrent memories (AMAGO's encoder: 3); each saves
    # ~12k floats per row and step for its backward, so 3 would estimate a Pendulum update at 4.5 GiB.
    layers: int = checked(1, at_least(1))
    d_state: int = checked(16, at_least(1))  # N, the SSM state per inner channel
    expand: int = checked(2, at_least(1))  # E: the blocks' inner width ED = E * policy.rnn_hidden_size
    d_conv: int = checked(4, at_least(1))  # the causal depthwise convolution's taps (acting keeps d_conv - 1 inputs)
    dt_rank: Optional[int] = checked(None, _SIZE_OR_NULL)  # Delta's low-rank width; null: ceil(rnn_hidden_size / 16)
    # Delta's bias starts at softplus^-1 of steps log-uniform in [dt_min, dt_max] (<=, check_together), floored
    dt_min: float = checked(0.001, above(0))
    dt_max: float = checked(0.1, above(0))
    dt_init_floor: float = checked(1e-4, at_least(0))
    # dt_proj's weight: uniform in +-dt_scale / sqrt(dt_rank) ("random") or that bound everywhere ("constant")
    dt_init: str = checked("random", one_of(("random", "constant")))
    dt_scale: float = checked(1.0, at_least(0))
    rms_norm_eps: float = checked(1e-5, above(0))  # every RMSNorm's
    bias: bool = False  # in_proj's and out_proj's biases
    conv_bias: bool = True

    def check_together(self, key: str) -> None:
        if self.dt_min > self.dt_max:
            raise ValueError(f"{key}.dt_min={self.dt_min!r} must be <= {key}.dt_max={self.dt_max!r}")


@dataclass
class S5Config:
    """S5's options, the config section policy.s5 (pomdp_ffm/seq_models/s5.py): state_size as s5-pytorch's S5, blocks
    as the authors' code (lindermanlab/S5 run_train.py), dt_min and dt_max as both."""

    # P, the paper's state size: P / 2 complex states (conjugate symmetry); null: policy.rnn_hidden_size. It must be
    # a multiple of 2 * blocks (check_together, check_chosen).
    state_size: Optional[int] = checked(None, _SIZE_OR_NULL)
    # J, the HiPPO-N blocks of size P / J on the diagonal of the initial state matrix (the package's default: 1)
    blocks: int = checked(8, at_least(1))
    # The steps Delta start log-uniform in [dt_min, dt_max]; dt_min <= dt_max (check_together)
    dt_min: float = checked(0.001, above(0))
    dt_max: float = checked(0.1, above(0))
    # Lambda's real parts used clipped to <= -1e-4, so that no state grows over an episode of any length: the
    # authors' code's option, which it recommends for unbounded sequence lengths (off by default there)
    clip_eigs: bool = True

    def check_together(self, key: str) -> None:
        if self.dt_max < self.dt_min:
            raise ValueError(f"{key}.dt_max={self.dt_max!r} must be >= {key}.dt_min={self.dt_min!r}")
        if self.state_size is not None and self.state_size % (2 * self.blocks):
            raise ValueError(
                f"{key}.state_size={self.state_size} must be a multiple of 2 * {key}.blocks={self.blocks} (each "
                "block's eigenvalues come in conjugate pairs)"
            )

    def check_chosen(self, key: str, policy) -> None:
        h = policy.rnn_hidden_size
        if self.state_size is None and h % (2 * self.blocks):
            raise ValueError(
                f"policy.rnn_hidden_size={h} must be a multiple of 2 * {key}.blocks={self.blocks} with "
                f"policy.seq_model=s5 and {key}.state_size=null (the state size P = h: each block's eigenvalues "
                f"come in conjugate pairs); or set {key}.state_size"
            )


@dataclass
class MLSTMConfig:
    """mLSTM's options, the config section policy.mlstm (pomdp_ffm/seq_models/mlstm.py); the defaults are the package
    xlstm's (2.0.6, mLSTMLayerConfig), layers 1 (one block, as the agent's other recurrent memories have one layer)."""

    layers: int = checked(1, at_least(1))  # mLSTM blocks (pre-LayerNorm, residual), as xLSTMBlockStack stacks them
    heads: int = checked(4, at_least(1))  # the cell's heads, which must divide the up-projection's width (check_chosen)
    # The up-projection's width D = proj_factor * policy.rnn_hidden_size rounded up to a multiple of 64 (the package's)
    proj_factor: float = checked(2.0, above(0))
    conv1d_kernel_size: int = checked(4, at_least(1))  # the causal conv of q's and k's input: acting keeps K - 1 steps
    qkv_proj_blocksize: int = checked(4, at_least(1))  # the blocks of q's, k's and v's block-diagonal projections

    def unfit(self, hidden_size: int, key: str = "") -> str | None:
        """Why D at ``hidden_size`` does not split into heads and q, k, v blocks (naming ``key``.<option>), or None."""
        d, key = up_projection(hidden_size, self.proj_factor), key and key + "."
        bad = [f"{key}heads={self.heads}"] if d % self.heads else []
        bad += [f"{key}qkv_proj_blocksize={self.qkv_proj_blocksize}"] if d % self.qkv_proj_blocksize else []
        return f"its up-projection's width {d} must be a multiple of {' and '.join(bad)}" if bad else None

    def check_chosen(self, key: str, policy) -> None:
        h = policy.rnn_hidden_size
        if why := self.unfit(h, key):
            raise ValueError(f"policy.rnn_hidden_size={h} with policy.seq_model=mlstm: {why}")


@dataclass
class SLSTMConfig(_OverHeads):
    """sLSTM's options, the config section policy.slstm (pomdp_ffm/seq_models/slstm.py): xLSTM sLSTM blocks of width
    policy.rnn_hidden_size; the defaults are those of the package xlstm 2.0.6 (its xLSTMBlockStackConfig,
    sLSTMBlockConfig, sLSTMLayerConfig, sLSTMCellConfig and FeedForwardConfig)."""

    layers: int = checked(1, at_least(1))  # sLSTM blocks, residual and pre-LayerNorm (the stack's num_blocks)
    heads: int = checked(4, at_least(1))  # recurrent heads, which must divide policy.rnn_hidden_size (check_chosen)
    # the causal depthwise convolution (+ SiLU) before the input and forget gates, in steps; 0: none
    conv_kernel: int = checked(4, at_least(0))
    feedforward: bool = True  # the block's gated feed-forward after the sLSTM (sLSTMBlockConfig.feedforward)
    # its up-projection, proj_factor * h rounded up to a multiple of 64 (the paper writes 4/3)
    proj_factor: float = checked(1.3, above(0))
    # the gates' biases: the forget gate's a power law over each head's units that depends on the block's depth
    # (powerlaw_blockdependent), linearly 3 to 6 (small_init), or every gate's U(-1/sqrt(h), 1/sqrt(h)) (standard)
    bias_init: str = checked("powerlaw_blockdependent", one_of(("powerlaw_blockdependent", "small_init", "standard")))
    # the per-head recurrent weights: zeros, or U(-1/sqrt(h), 1/sqrt(h)) (standard)
    recurrent_init: str = checked("zeros", one_of(("zeros", "standard")))


# FFM (pomdp_ffm/seq_models/ffm.py)
FFM_AGGREGATORS = ("auto", "loop", "scan", "assoc", "closed")
PARAM_MODES = ("learned", "fixed", "none")
# gamma's [m, c] entries: the paper's outer product of m decays and c frequencies, or one of each per entry (HP)
DECAY_CONTEXT_PRODUCTS = ("outer", "hadamard")
F64_MAX_LOG = math.log(sys.float_info.max)
# The longest decay horizon whose bound leaves the default initialisation's top rate positive.
MAX_DECAY_HORIZON = int(F64_MAX_LOG / 0.02)
# The closed form takes log(gamma) of a complex64 gamma: below this horizon the bound lets exp(-alpha) underflow
# float32 to 0 (its smallest normal is 2^-126), whose log is -inf.
MIN_CLOSED_DECAY_HORIZON = math.ceil(F64_MAX_LOG / (126 * math.log(2) + 0.01))


def _splits(h: int, context_size: int | None, memory_size: int | None) -> bool:
    c = h // 32 if context_size is None else context_size
    return c >= 1 and (memory_size is not None or h % c == 0)


def size_rule(h: int, context_size: int | None = None, memory_size: int | None = None) -> tuple[str, str] | None:
    """What a hidden size ``h`` must be for FFM to split it, and why: ("at least 32", "(FFM's ...)"), or None where
    it splits. FFM's state is m memory rows by c context columns: c = context_size, else h // 32; m = memory_size,
    else h // c, which must then fill h (m * c = h: the reference's sizing). So by default h >= 32 (c >= 1) and h a
    multiple of its c: every h in 32-63 (c = 1), 64, 66, ... 94 (c = 2), but not 100 (c = 3, m = 33, m * c = 99).
    Given memory_size, any c >= 1 and m >= 1 (the read-out maps the 2 m c state floats to h outputs)."""
    if _splits(h, context_size, memory_size):
        return None
    if context_size is not None:  # (memory_size None: m = h // c must fill h)
        c = context_size
        m = h // c
        return (
            f"a multiple of context_size={c}",
            f"(m = h // c = {m} memory rows of c columns must fill it: {m} x {c} = {m * c})",
        )
    if h < 32:
        return "at least 32", "(FFM's c = h // 32 context columns must be at least 1; m = h // c memory rows fill h)"
    c, below = h // 32, next(n for n in range(h, 31, -1) if _splits(n, None, None))
    above = next(n for n in range(h + 1, 32 * (c + 1) + 1) if _splits(n, None, None))  # (32 (c + 1) splits)
    m = h // c
    return (
        f"a multiple of its c = h // 32 = {c}",
        f"(FFM's m = h // c = {m} memory rows of c context columns must fill it: {m} x {c} = {m * c}), "
        f"e.g. {below} or {above}",
    )


_STEP_RANGE = must(
    lambda v: v is None or (len(v) == 2 and all(math.isfinite(x) for x in v) and 0 < v[0] <= v[1]),
    "null or [low, high] in steps with 0 < low <= high, both finite, e.g. [32,104]",
)


@dataclass
class FFMConfig:
    """FFM's options, the config section policy.ffm; the fork's sizing (docs/reference.md#ffm-module)."""

    context_size: Optional[int] = checked(None, _SIZE_OR_NULL)  # c; null: h // 32 (4 for h = 128)
    memory_size: Optional[int] = checked(None, _SIZE_OR_NULL)  # m; null: h // c (32 for h = 128)
    max_period: float = 128  # t_e; >= min_period (check_together)
    min_period: float = checked(1, above(0))
    beta: float = checked(0.01, must(lambda v: 0 < v < 1, "in (0, 1) (the fraction a trace decays to)"))
    # |gamma|^(-t) stays finite in float64 over this many steps (the reference's max_len; not the episode length;
    # patches/104); the closed chunk length.
    decay_horizon: int = checked(1024, within(1, MAX_DECAY_HORIZON, " (steps)"))
    decay_bound: bool = True
    input_gate: bool = True
    output_gate: bool = True
    context: str = checked("learned", one_of(PARAM_MODES))
    decay: str = checked("learned", one_of(PARAM_MODES))
    # FFM's decay gamma = exp(-alpha) exp(i omega)^T ("outer", the paper) or one alpha, omega per entry ("hadamard",
    # the HP ablation); FFM's complex decay, not the discount policy.gamma
    decay_context_product: str = checked("outer", one_of(DECAY_CONTEXT_PRODUCTS))
    aggregator: str = checked("auto", one_of(FFM_AGGREGATORS))
    # Informed initialisation (the paper's decay figure): ranges of t_alpha and t_omega in steps.
    init_trace_range: Optional[List[float]] = checked(None, _STEP_RANGE)
    init_period_range: Optional[List[float]] = checked(None, _STEP_RANGE)

    def check_together(self, key: str) -> None:
        """The rules tying the section's fields (``key``: "policy.ffm"), checked whichever memory is chosen."""
        if self.max_period < self.min_period:
            raise ValueError(f"{key}.max_period={self.max_period!r} must be >= {key}.min_period={self.min_period!r}")
        if self.aggregator == "closed" and self.decay_horizon < MIN_CLOSED_DECAY_HORIZON:
            raise ValueError(
                f"{key}.decay_horizon={self.decay_horizon} must be >= {MIN_CLOSED_DECAY_HORIZON} "
                f"with {key}.aggregator=closed (a shorter one lets the decay underflow gamma, whose "
                "log the closed form takes); the other aggregators take any"
            )

    def check_chosen(self, key: str, policy) -> None:
        """The rules tying the section to the policy's other fields, where FFM is policy.seq_model."""
        h, c = policy.rnn_hidden_size, self.context_size
        rule = size_rule(h, c, self.memory_size)
        if rule is not None:
            must, why = rule[0].replace("context_size=", f"{key}.context_size="), rule[1]
            fix = f"set {key}.context_size to a divisor of it" if c is None else f"set {key}.memory_size too"
            raise ValueError(f"policy.rnn_hidden_size={h} must be {must} with policy.seq_model=ffm {why}; or {fix}")
