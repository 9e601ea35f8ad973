"""Tiny Hugging Face checkpoints written by transformers, shared by the model tests."""

import json
from pathlib import Path

import pytest
import torch

from engine.core.config import EngineConfig
from engine.model.loader import LoadedModel, load_model

TINY = dict(
    vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
)


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random (biases and norms too), so no part of the parity check is vacuous."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1 + 0.1 * noise if name.endswith("norm.weight") else 0.1 * noise)


CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention reads keys and values through a block table.",
    "Prefix caching shares identical prompt blocks between requests.",
    "Grüße aus Köln: ünïcödé text, emoji 🙂 and 中文 too.",
] * 4
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(folder: Path, vocab_size: int = 300) -> None:
    """A byte-level BPE trained on a few lines, with Llama-style bos post-processing."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "bos_token": {"content": "<s>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "eos_token": "<|im_end|>",
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def write_checkpoint(folder: Path, arch: str, seed: int = 0, max_shard_size: str | None = None, **overrides):
    """Save a random transformers model in HF layout; returns the transformers model (eval, fp32)."""
    import transformers

    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                  "mistral": transformers.MistralConfig}[arch]
    model_cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
                 "mistral": transformers.MistralForCausalLM}[arch]
    config = config_cls(**{**TINY, **overrides})
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    randomize(model, seed)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, safe_serialization=True, **kwargs)
    write_tokenizer(folder, vocab_size=config.vocab_size)
    return model


def load(folder: Path, **kwargs) -> LoadedModel:
    return load_model(EngineConfig(model=str(folder), **kwargs))


@pytest.fixture(scope="session")
def llama_ckpt(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("tiny-llama")
    return folder, write_checkpoint(folder, "llama", seed=1, rope_theta=5000.0)


@pytest.fixture(scope="session")
def builtin() -> LoadedModel:
    return load_model(EngineConfig())
