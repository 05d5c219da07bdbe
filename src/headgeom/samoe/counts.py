"""Parameter counts, analytical FLOPs per token and trace sizes (SAMOE §8, paper App. A.6,
D.8), from a family's shapes alone, and the counts of a built model to check them against.

* **Active parameters** = every non-routed parameter + the shared expert + top_k routed
  experts per layer (normative). P and LWO have identical counts.
* **FLOPs/token** [RECONSTRUCTED] = 2·Σ(active matmul weights, LM head, routers and write
  heads included) + Σ_l 4·C_l·n_head·d_head, C_l = T for full attention and the window for
  sliding layers; biases, norms and the embedding lookup are not matmul work.
* **Trace sizes** (bf16, 2 bytes an element): all realised writes N·T·r, the live state
  T·r, and the clean Top-3 ids and logits N·T·3·(2 + 2).

The paper's shapes (SAMOE §4; norms ignored, as the spec's counts do) are ``SMOLLM2`` and
``GEMMA``; :func:`toy_shape` gives the workspace GPT's, norms, biases and positions included,
so it equals the built toy model's ``n_params`` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headgeom.model.config import ModelConfig
from headgeom.samoe.config import STATE_VARIANTS, MoEConfig, check_variant
from headgeom.samoe.hub import HubSAMoE
from headgeom.samoe.model import MoEModel, param_kind

MIB = 2**20
BF16_BYTES = 2


@dataclass(frozen=True)
class FamilyShape:
    """The shapes that the counts depend on (one dense family)."""

    name: str
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    d_head: int
    d_ffn: int
    ffn_matrices: int  # 2: plain MLP (up, down); 3: gated (gate, up, down)
    n_vocab: int  # tied embedding and LM head
    seq_len: int
    window: int | None = None  # sliding-window length
    sliding_layers: tuple[int, ...] = ()
    n_positions: int = 0  # learned position embeddings (the toy)
    attn_bias: bool = False
    ffn_bias: bool = False
    norm_params_per_layer: int = 0  # 0: norms ignored (SAMOE §8)
    final_norm_params: int = 0
    # (gate, up) biases are d_ffn each, the down projection's is d_model
    ffn_bias_params: int = field(init=False)

    def __post_init__(self) -> None:
        bias = (self.ffn_matrices - 1) * self.d_ffn + self.d_model if self.ffn_bias else 0
        object.__setattr__(self, "ffn_bias_params", bias)

    def context(self, layer: int) -> int:
        """C_l: keys a query attends to in the formula (T, or the window when sliding)."""
        return self.window if layer in self.sliding_layers else self.seq_len


#: SAMOE §4 (from the public configs): SmolLM2-135M and Gemma-3-270m.
SMOLLM2 = FamilyShape(
    name="smollm2",
    n_layer=30,
    d_model=576,
    n_head=9,
    n_kv_head=3,
    d_head=64,
    d_ffn=1536,
    ffn_matrices=3,
    n_vocab=49_152,
    seq_len=2048,
)
GEMMA = FamilyShape(name="gemma", n_layer=18, d_model=640, n_head=4, n_kv_head=1, d_head=256,
                    d_ffn=2048, ffn_matrices=3, n_vocab=262_144, seq_len=2048, window=512,
                    # 5 of every 6 layers slide; layers 5, 11, 17 attend fully
                    sliding_layers=tuple(i for i in range(18) if i % 6 != 5))  # fmt: skip

#: The paper's dense sources by Hub repository (SAMOE §4, §19.2).
PAPER_SHAPES = {"HuggingFaceTB/SmolLM2-135M": SMOLLM2, "google/gemma-3-270m": GEMMA}


def toy_shape(cfg: ModelConfig, name: str = "toy") -> FamilyShape:
    """The workspace GPT's shapes: GELU MLP with biases, q/k/v/o with biases, two LayerNorms
    per block plus the final one, learned positions; T = n_ctx."""
    return FamilyShape(name=name, n_layer=cfg.n_layer, d_model=cfg.d_model,
                       n_head=cfg.n_head, n_kv_head=cfg.n_head, d_head=cfg.d_head,
                       d_ffn=cfg.d_mlp, ffn_matrices=2, n_vocab=cfg.n_vocab,
                       seq_len=cfg.n_ctx, n_positions=cfg.n_ctx, attn_bias=True,
                       ffn_bias=True, norm_params_per_layer=4 * cfg.d_model,
                       final_norm_params=2 * cfg.d_model)  # fmt: skip


def hub_shape(config, name: str = "hub", seq_len: int | None = None) -> FamilyShape:
    """The shapes of a Hub model (``PretrainedConfig``: Llama or Gemma 3 text), its norms
    included so the counts equal the built model's exactly: RMSNorm weights only, two per
    Llama layer, four per Gemma 3 layer plus the q/k norms of d_head each; T defaults to the
    model's context."""
    d, heads = config.hidden_size, config.num_attention_heads
    d_head = getattr(config, "head_dim", None) or d // heads
    gemma = config.model_type == "gemma3_text"
    types = list(getattr(config, "layer_types", None) or [])
    return FamilyShape(
        name=name, n_layer=config.num_hidden_layers, d_model=d, n_head=heads,
        n_kv_head=config.num_key_value_heads, d_head=d_head, d_ffn=config.intermediate_size,
        ffn_matrices=3, n_vocab=config.vocab_size,
        seq_len=seq_len or config.max_position_embeddings,
        window=getattr(config, "sliding_window", None) if gemma else None,
        sliding_layers=tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
        attn_bias=bool(getattr(config, "attention_bias", False)),
        ffn_bias=bool(getattr(config, "mlp_bias", False)),
        norm_params_per_layer=(4 * d + 2 * d_head) if gemma else 2 * d, final_norm_params=d,
    )  # fmt: skip


def model_shape(model: MoEModel) -> FamilyShape:
    """The shapes of a built SA-MoE, whatever its host."""
    if isinstance(model, HubSAMoE):
        return hub_shape(model.source.hf_config())
    return toy_shape(model.cfg)


@dataclass(frozen=True)
class Counts:
    total: int
    active: int
    active_matmul: int  # the weights of the FLOP formula's first term
    flops_per_token: int


def counts(shape: FamilyShape, moe: MoEConfig, variant: str) -> Counts:
    """SAMOE §8 counts of ``variant`` of the MoE upcycled from ``shape``."""
    check_variant(variant)
    d, E, k, r = shape.d_model, moe.n_experts, moe.top_k, moe.state_dim
    q_width, kv_width = shape.n_head * shape.d_head, shape.n_kv_head * shape.d_head
    attn_w = 2 * d * q_width + 2 * d * kv_width  # q, o; k, v
    attn_b = (q_width + 2 * kv_width + d) if shape.attn_bias else 0
    expert_w = shape.ffn_matrices * d * shape.d_ffn
    expert = expert_w + shape.ffn_bias_params
    state = variant in STATE_VARIANTS
    router = E * d + (E * r if state else 0)
    write_w = r * d if state else 0
    write = write_w + (r if state else 0)
    per_layer_fixed = attn_w + attn_b + router + write + shape.norm_params_per_layer
    embed = shape.n_vocab * d + shape.n_positions * d + shape.final_norm_params
    N = shape.n_layer
    total = embed + N * (per_layer_fixed + (1 + E) * expert)
    active = embed + N * (per_layer_fixed + (1 + k) * expert)
    active_matmul = shape.n_vocab * d + N * (attn_w + (1 + k) * expert_w + router + write_w)
    attention = sum(4 * shape.context(i) * q_width for i in range(N))
    return Counts(total=total, active=active, active_matmul=active_matmul,
                  flops_per_token=2 * active_matmul + attention)  # fmt: skip


@dataclass(frozen=True)
class TraceSizes:
    """bf16 trace sizes in MiB (SAMOE §8)."""

    writes: float  # N·T·r
    live_state: float  # T·r
    writes_and_top3: float  # + N·T·3 (2-byte id + 2-byte logit)


def trace_sizes(shape: FamilyShape, moe: MoEConfig) -> TraceSizes:
    N, T, r = shape.n_layer, shape.seq_len, moe.state_dim
    writes = N * T * r * BF16_BYTES
    top3 = N * T * 3 * (2 + BF16_BYTES)
    return TraceSizes(writes=writes / MIB, live_state=T * r * BF16_BYTES / MIB,
                      writes_and_top3=(writes + top3) / MIB)  # fmt: skip


def model_counts(model: MoEModel) -> tuple[int, int]:
    """(total, active) parameters of a built model, counted from its tensors: active drops
    E − k of each layer's E routed experts (they are equal-sized)."""
    total = model.n_params()
    routed = sum(p.numel() for n, p in model.named_parameters() if param_kind(n) == "routed")
    moe = model.moe_cfg
    return total, total - routed * (moe.n_experts - moe.top_k) // moe.n_experts


# --------------------------------------------------------------------------- cost
#: bf16 dense peak of one H100 SXM (FLOP/s), and the model FLOPs utilisation the SA-MoE
#: paper-scale requests assume (an MoE's routing and gathers run well below dense MFU).
H100_BF16, ASSUMED_MFU = 989e12, 0.20


def cpt_flops(shape: FamilyShape, moe: MoEConfig, variant: str, steps: int,
              batch_seqs: int) -> float:  # fmt: skip
    """Continued-pretraining FLOPs of one run: forward + backward = 3 × the forward FLOPs per
    token (SAMOE §8's count) × every token of every update."""
    return 3.0 * counts(shape, moe, variant).flops_per_token * steps * batch_seqs * shape.seq_len


def cpt_hours(shape: FamilyShape, moe: MoEConfig, variant: str, steps: int, batch_seqs: int,
              gpus: int, mfu: float = ASSUMED_MFU) -> float:  # fmt: skip
    """Wall hours of one run on ``gpus`` H100s at ``mfu`` of the bf16 peak."""
    return cpt_flops(shape, moe, variant, steps, batch_seqs) / (gpus * H100_BF16 * mfu) / 3600
