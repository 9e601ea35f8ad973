"""forward_full matches transformers' logits on tiny random checkpoints in Hugging Face layout."""

import json

import pytest
import torch

from tests.model.conftest import load, write_checkpoint

ATOL = 1e-4


def reference_logits(hf_model, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(input_ids=input_ids).logits


def assert_parity(folder, hf_model, seq_len: int = 37) -> None:
    loaded = load(folder)
    gen = torch.Generator().manual_seed(7)
    input_ids = torch.randint(0, loaded.model_config.vocab_size, (2, seq_len), generator=gen)
    ours = loaded.model.forward_full(input_ids)
    theirs = reference_logits(hf_model, input_ids)
    assert ours.shape == theirs.shape == (2, seq_len, loaded.model_config.vocab_size)
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_llama_untied(llama_ckpt):
    folder, hf_model = llama_ckpt
    loaded = load(folder)
    assert loaded.model_config.rope_theta == 5000.0
    assert not loaded.model_config.tie_word_embeddings
    assert loaded.model.lm_head.weight.data_ptr() != loaded.model.model.embed_tokens.weight.data_ptr()
    assert_parity(folder, hf_model)


def test_llama_tied_has_no_lm_head_tensor(tmp_path):
    hf_model = write_checkpoint(tmp_path, "llama", seed=2, tie_word_embeddings=True)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()
    loaded = load(tmp_path)
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight
    assert_parity(tmp_path, hf_model)


def test_qwen2_with_qkv_bias(tmp_path):
    hf_model = write_checkpoint(tmp_path, "qwen2", seed=3, tie_word_embeddings=True, rope_theta=1e6)
    loaded = load(tmp_path)
    attn = loaded.model.model.layers[0].self_attn
    assert loaded.model_config.attention_bias and attn.q_proj.bias is not None
    assert attn.o_proj.bias is None  # Qwen2 has no o_proj bias
    assert_parity(tmp_path, hf_model)


def test_llama_attention_bias_includes_o_proj(tmp_path):
    hf_model = write_checkpoint(tmp_path, "llama", seed=4, attention_bias=True)
    loaded = load(tmp_path)
    assert loaded.model.model.layers[1].self_attn.o_proj.bias is not None
    assert_parity(tmp_path, hf_model)


def test_llama3_rope_scaling_and_explicit_head_dim(tmp_path):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    hf_model = write_checkpoint(tmp_path, "llama", seed=5, head_dim=32, rope_parameters=rope)
    loaded = load(tmp_path)
    assert loaded.model_config.head_dim == 32 and loaded.model_config.rope_scaling["rope_type"] == "llama3"
    assert_parity(tmp_path, hf_model, seq_len=60)


def test_sharded_checkpoint_through_index(tmp_path):
    hf_model = write_checkpoint(tmp_path, "mistral", seed=6, max_shard_size="50KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    loaded = load(tmp_path)
    assert loaded.name == tmp_path.name
    assert loaded.weights_bytes == sum(p.numel() * 4 for p in hf_model.parameters())
    assert_parity(tmp_path, hf_model)


def test_digest_covers_config_and_weights(llama_ckpt, tmp_path):
    folder, _ = llama_ckpt
    first = load(folder).digest
    assert len(first) == 12 and load(folder).digest == first
    other = write_checkpoint(tmp_path, "llama", seed=99, rope_theta=5000.0)
    assert other is not None and load(tmp_path).digest != first


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_dtypes_load_and_track_float32(llama_ckpt, dtype):
    folder, hf_model = llama_ckpt
    loaded = load(folder, dtype=dtype)
    assert loaded.model.lm_head.weight.dtype == getattr(torch, dtype)
    assert loaded.weights_bytes == sum(p.numel() * 2 for p in hf_model.parameters())
    input_ids = torch.arange(20)[None, :]
    ours = loaded.model.forward_full(input_ids).float()
    theirs = reference_logits(hf_model, input_ids)
    assert (ours - theirs).abs().max() < 0.1
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() > 0.9
