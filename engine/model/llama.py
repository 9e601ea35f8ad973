"""Llama-family decoder (Llama, Mistral, Qwen2) in one file, with paged and cache-free forward."""

import math
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ModelLoadError
from engine.model.attention import AttentionMetadata, GatherWorkspace, PagedPlan, paged_attention, plan_paged

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
MODEL_TYPE_TO_ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


@dataclass(slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2; Llama's attention_bias)
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    o_proj_bias: bool = False  # Llama's attention_bias also puts a bias on o_proj; Qwen2 does not
    rope_scaling: dict | None = None  # Llama 3 "llama3" frequency scaling, or "linear"

    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        """Build from a Hugging Face config.json dict; ModelLoadError for what we cannot run."""
        arch = _architecture(hf)
        is_qwen2 = arch == "Qwen2ForCausalLM"
        heads, hidden = _num(hf, "num_attention_heads", int), _num(hf, "hidden_size", int)
        bias = is_qwen2 or bool(hf.get("attention_bias", False))
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        theta = _num(rope, "rope_theta", float, 10000.0) if isinstance(rope, dict) else 10000.0
        max_pos = _num(hf, "max_position_embeddings", int, 4096)
        window = hf.get("sliding_window")
        if window and (not is_qwen2 or hf.get("use_sliding_window")):
            max_pos = min(max_pos, _num(hf, "sliding_window", int))  # no sliding-window kernel: stay inside
        cfg = cls(
            vocab_size=_num(hf, "vocab_size", int),
            hidden_size=hidden,
            intermediate_size=_num(hf, "intermediate_size", int),
            num_hidden_layers=_num(hf, "num_hidden_layers", int),
            num_attention_heads=heads,
            num_key_value_heads=_num(hf, "num_key_value_heads", int, heads),
            head_dim=_num(hf, "head_dim", int, hidden // heads),
            rms_norm_eps=_num(hf, "rms_norm_eps", float, 1e-6),
            rope_theta=_num(hf, "rope_theta", float, None) if hf.get("rope_theta") else theta,
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bias,
            bos_token_id=_first_id(hf.get("bos_token_id")),
            eos_token_id=_first_id(hf.get("eos_token_id")),
            o_proj_bias=bias and not is_qwen2,
            rope_scaling=_rope_scaling(rope),
        )
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ModelLoadError(
                f"config.json: num_attention_heads ({cfg.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({cfg.num_key_value_heads})"
            )
        return cfg

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of every layer for one token."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    def num_params(self) -> int:
        """Parameter count as built (tied embeddings counted once)."""
        q_dim = self.num_attention_heads * self.head_dim
        kv_dim = self.num_key_value_heads * self.head_dim
        h = self.hidden_size
        attn = h * q_dim + 2 * h * kv_dim + q_dim * h
        if self.attention_bias:
            attn += q_dim + 2 * kv_dim
        if self.o_proj_bias:
            attn += h
        layer = attn + 3 * h * self.intermediate_size + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embed + h


def _architecture(hf: dict) -> str:
    archs = hf.get("architectures") or [MODEL_TYPE_TO_ARCH.get(hf.get("model_type"))]
    arch = archs[0] if isinstance(archs, list) else archs
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported architecture {arch or hf.get('model_type')!r} in config.json; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if hf.get("mlp_bias"):
        raise ModelLoadError("config.json sets mlp_bias=true, which this engine does not support")
    return arch


def _num(hf: dict, key: str, kind: type, default=None):
    """A positive int/float field of config.json; ModelLoadError naming the key otherwise."""
    value = hf.get(key)
    if value is None:
        if default is None:
            raise ModelLoadError(f"config.json has no {key}")
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0 or kind(value) != value:
        raise ModelLoadError(f"config.json: {key} must be a positive {kind.__name__}, got {value!r}")
    return kind(value)


def _first_id(value) -> int | None:
    """Token ids in config.json may be an int, a list (Llama 3 eos) or null."""
    if isinstance(value, list):
        value = value[0] if value else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ModelLoadError(f"config.json: token id must be an integer, got {value!r}")
    return value


ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def _rope_scaling(rope: dict) -> dict | None:
    """Validated at load, so a bad rope config never fails inside a request."""
    if not isinstance(rope, dict):
        raise ModelLoadError(f"config.json: rope scaling must be an object, got {rope!r}")
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind == "default":
        return None
    if kind not in ROPE_SCALING_KEYS:
        raise ModelLoadError(f"config.json: rope scaling type {kind!r} is not supported (llama3, linear are)")
    scaling = {"rope_type": kind}
    for key in ROPE_SCALING_KEYS[kind]:
        scaling[key] = _num(rope, key, float)
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ModelLoadError("config.json: llama3 rope scaling needs high_freq_factor > low_freq_factor")
    return scaling


def rope_inv_freq(cfg: ModelConfig, device: torch.device) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] in float32, as Hugging Face computes them."""
    dim = cfg.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    inv_freq = 1.0 / (cfg.rope_theta**exponents)
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return inv_freq / scaling["factor"]
    # llama3: keep high frequencies, divide low ones by factor, blend in between.
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, blended, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., S, H, D] with cos/sin [..., S, 1, D] (Hugging Face rotate_half convention)."""
    return x * cos + rotate_half(x) * sin


# Parameters start uninitialized (torch.empty): the loader assigns every tensor. Unlike nn.Linear,
# nothing runs an init op, so building on the meta device never loads PyTorch's Python meta
# kernels (seconds of start-up in every process).
class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = Linear(cfg.hidden_size, q_dim, bias=cfg.attention_bias)
        self.k_proj = Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.v_proj = Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.o_proj = Linear(q_dim, cfg.hidden_size, bias=cfg.o_proj_bias)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        lead = x.shape[:-1]  # [T] or [B, S]
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)  # [..., H, D]
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)  # [..., Hkv, D]
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)  # [..., Hkv, D]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward_paged(self, x, cos, sin, kv_cache, attn: AttentionMetadata, plan: PagedPlan):
        q, k, v = self._qkv(x, cos, sin)  # [T, H, D], [T, Hkv, D], [T, Hkv, D]
        out = paged_attention(q, k, v, kv_cache, attn, plan)  # [T, H, D]
        return self.o_proj(out.reshape(x.shape[0], -1))  # [T, hidden]

    def forward_full(self, x, cos, sin):
        batch, seq = x.shape[:2]
        q, k, v = self._qkv(x, cos, sin)  # [B, S, H, D], [B, S, Hkv, D] x2
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )  # [B, H, S, D]
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))  # [B, S, hidden]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv_cache=None, attn=None, plan=None):
        h = self.input_layernorm(x)
        if attn is None:
            x = x + self.self_attn.forward_full(h, cos, sin)
        else:
            x = x + self.self_attn.forward_paged(h, cos, sin, kv_cache, attn, plan)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """Parameter names match Hugging Face's (`model.layers.N.self_attn.q_proj.weight`, `lm_head.weight`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()
        self._inv_freq: torch.Tensor | None = None
        # Gather buffers reused across layers and steps; per thread, since engines that share
        # one loaded model may step in different threads.
        self._workspaces = threading.local()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [..., S, 1, D] in the model dtype for positions [..., S]."""
        if self._inv_freq is None or self._inv_freq.device != positions.device:
            self._inv_freq = rope_inv_freq(self.config, positions.device)
        freqs = positions.float()[..., None] * self._inv_freq  # [..., S, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)[..., None, :]  # [..., S, 1, D]
        dtype = self.lm_head.weight.dtype
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        attn: AttentionMetadata,
    ) -> torch.Tensor:
        """Paged forward over T flattened tokens; logits [num_seqs, vocab] of each last new token."""
        workspace = getattr(self._workspaces, "gather", None)
        if workspace is None:
            workspace = self._workspaces.gather = GatherWorkspace()
        plan = plan_paged(attn, workspace)
        cos, sin = self.rope(positions)  # [T, 1, D]
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, cos, sin, kv_cache, attn, plan)
        if attn.is_decode_only:
            assert x.shape[0] == len(attn.query_start_loc) - 1, "is_decode_only needs one token per sequence"
            last = x  # [num_seqs, hidden]
        else:
            ends = torch.tensor(attn.query_start_loc[1:], device=x.device) - 1
            last = x[ends]  # [num_seqs, hidden]
        return self.lm_head(self.model.norm(last))  # [num_seqs, vocab]

    @torch.inference_mode()
    def forward_full(self, input_ids: torch.Tensor) -> torch.Tensor:
        """No cache: logits [B, S, vocab] for every position; the reference for parity tests."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]  # [1, S]
        cos, sin = self.rope(positions)  # [1, S, 1, D]
        x = self.model.embed_tokens(input_ids)  # [B, S, hidden]
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))  # [B, S, vocab]
