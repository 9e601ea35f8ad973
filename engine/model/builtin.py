"""The built-in model `builtin`: a tiny Llama with seeded random weights and a byte tokenizer.

Its text is noise. It exists so every part of the toolkit runs anywhere without a download;
any Llama / Mistral / Qwen2 checkpoint folder replaces it.
"""

import dataclasses
import hashlib
import json

import torch

from engine.model.llama import CausalLM, ModelConfig
from engine.model.tokenizer import ByteTokenizer

BUILTIN_NAME = "builtin"
BUILTIN_SEED = 20261129
BUILTIN_VERSION = "builtin-v1"  # bump when the weight recipe changes: it feeds the digest
SPECIAL_ROW_SCALE = 0.25  # shrink special-token logits so noise does not stop after 2 tokens

# Shaped for the CPU engine benchmark: ~30M fp32 parameters (~120 MB) do not fit in a CPU cache,
# so decode at batch 1 is memory-bound and batch 32 costs far less than 32 batch-1 steps.
_TOKENIZER = ByteTokenizer()
BUILTIN_CONFIG = ModelConfig(
    vocab_size=_TOKENIZER.vocab_size,
    hidden_size=512,
    intermediate_size=2048,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    attention_bias=False,
    bos_token_id=_TOKENIZER.bos_token_id,
    eos_token_id=_TOKENIZER.eos_token_id,
)
# Never sampled: control bytes but '\n', DEL and every byte >= 0x80 (UTF-8 lead and continuation
# bytes), and the specials but eos. Each sampled token is then one printable ASCII character or
# '\n' (or eos), so the noise decodes token by token and no partial UTF-8 is held back.
BUILTIN_SUPPRESS_TOKEN_IDS = [
    *(b for b in range(0x20) if b != 0x0A),
    *range(0x7F, 0x100),
    *(i for i in range(256, _TOKENIZER.vocab_size) if i != _TOKENIZER.eos_token_id),
]


def builtin_digest(cfg: ModelConfig = BUILTIN_CONFIG, seed: int = BUILTIN_SEED) -> str:
    """Short sha256 over the config, the seed, the weight recipe version and the suppressed ids."""
    payload = json.dumps(
        {"config": dataclasses.asdict(cfg), "seed": seed, "version": BUILTIN_VERSION,
         "suppress_token_ids": BUILTIN_SUPPRESS_TOKEN_IDS},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def builtin_tokenizer() -> ByteTokenizer:
    return ByteTokenizer()


def build_builtin(dtype: torch.dtype, device: torch.device, cfg: ModelConfig = BUILTIN_CONFIG) -> CausalLM:
    """Weights drawn on the CPU from a fixed-seed generator, so every process and device agrees."""
    gen = torch.Generator(device="cpu").manual_seed(BUILTIN_SEED)
    with torch.device("meta"):
        model = CausalLM(cfg)
    state: dict[str, torch.Tensor] = {}
    for name, param in model.state_dict().items():
        if name.endswith("norm.weight"):
            tensor = torch.ones(param.shape)
        elif name.endswith("embed_tokens.weight"):
            tensor = torch.randn(param.shape, generator=gen)
        else:  # Linear [out, in]: unit-variance outputs for unit-variance inputs
            tensor = torch.randn(param.shape, generator=gen) / param.shape[1] ** 0.5
        state[name] = tensor
    lm_head = state["lm_head.weight"]
    lm_head[256:] *= SPECIAL_ROW_SCALE  # special tokens (bos, eos, chat markers) follow the bytes
    state = {name: t.to(dtype=dtype, device=device) for name, t in state.items()}
    model.load_state_dict(state, assign=True, strict=True)
    model.tie_weights()
    return model.eval()
