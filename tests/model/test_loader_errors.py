"""Bad checkpoints and budgets fail with typed errors and one clear message, before allocating."""

import json
import subprocess
import sys

import pytest

from engine.errors import ModelLoadError, OutOfMemoryError
from engine.model.llama import ModelConfig
from engine.model.loader import check_memory, memory_budget
from tests.model.conftest import TINY, load

HUGE = dict(TINY, hidden_size=65536, intermediate_size=262144, num_hidden_layers=400,
            num_attention_heads=512, num_key_value_heads=512, vocab_size=256000)


def write_config(folder, **fields) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **TINY, **fields}))


def test_missing_folder(tmp_path):
    with pytest.raises(ModelLoadError, match=r"model folder .*nope does not exist \(use 'builtin'"):
        load(tmp_path / "nope")


def test_file_instead_of_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=r"config.json is not a folder \(give the checkpoint folder"):
        load(tmp_path / "config.json")


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load(tmp_path)


def test_malformed_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"config.json: not readable JSON"):
        load(tmp_path)


def test_config_missing_field(tmp_path):
    write_config(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    del data["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="config.json has no hidden_size"):
        load(tmp_path)
    write_config(tmp_path, num_hidden_layers="2")
    with pytest.raises(ModelLoadError, match="config.json: num_hidden_layers must be a positive int, got '2'"):
        load(tmp_path)
    write_config(tmp_path, num_attention_heads=0)
    with pytest.raises(ModelLoadError, match="num_attention_heads must be a positive int, got 0"):
        load(tmp_path)


def test_unsupported_architecture_is_named(tmp_path):
    write_config(tmp_path, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ModelLoadError, match=r"unsupported architecture 'GPT2LMHeadModel'.*LlamaForCausalLM"):
        load(tmp_path)


def test_no_weights(tmp_path):
    write_config(tmp_path)
    with pytest.raises(ModelLoadError, match=r"no \*.safetensors weights"):
        load(tmp_path)


def test_index_names_a_missing_shard(tmp_path):
    write_config(tmp_path)
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="model-00001-of-00002.safetensors listed in the index is missing"):
        load(tmp_path)


def test_truncated_weights_file(llama_ckpt, tmp_path):
    folder, _ = llama_ckpt
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:1000])
    with pytest.raises(ModelLoadError, match="cannot read safetensors"):
        load(tmp_path)


def test_config_weights_mismatch(llama_ckpt, tmp_path):
    folder, _ = llama_ckpt
    for name in ("tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    write_config(tmp_path, intermediate_size=128)
    with pytest.raises(ModelLoadError, match=r"model.layers.0.mlp.down_proj.weight has shape \(64, 96\), config.json implies \(64, 128\)"):
        load(tmp_path)


def test_weights_over_memory_budget_fail_before_loading(tmp_path):
    write_config(tmp_path, **HUGE)
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: the budget check comes first
    with pytest.raises(OutOfMemoryError) as info:
        load(tmp_path)
    message = str(info.value)
    assert message.startswith("model weights need ")
    assert "GiB in float32, more than the " in message and "MemAvailable in /proc/meminfo" in message
    assert "a smaller dtype (bfloat16 or float16), a smaller model" in message


def test_memory_message_in_half_precision_drops_dtype_advice():
    import torch

    budget, source = memory_budget(torch.device("cpu"), None)
    assert source == "MemAvailable in /proc/meminfo" and budget > 0
    with pytest.raises(OutOfMemoryError, match=r"try a smaller model or a device with more memory$"):
        check_memory(budget + 1, torch.bfloat16, torch.device("cpu"), None)
    check_memory(budget // 2, torch.bfloat16, torch.device("cpu"), None)


def test_bad_dtype_and_device():
    from engine.core.config import EngineConfig
    from engine.model.loader import load_model

    with pytest.raises(ModelLoadError, match="unsupported dtype 'float8'"):
        load_model(EngineConfig(dtype="float8"))
    with pytest.raises(ModelLoadError, match="bad device 'gpu0'"):
        load_model(EngineConfig(device="gpu0"))


def test_other_hf_config_refusals():
    base = {"architectures": ["MistralForCausalLM"], **TINY}
    with pytest.raises(ModelLoadError, match="mlp_bias"):
        ModelConfig.from_hf({**base, "mlp_bias": True})
    with pytest.raises(ModelLoadError, match="rope scaling type 'yarn' is not supported"):
        ModelConfig.from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ModelLoadError, match=r"num_attention_heads \(4\) is not a multiple of num_key_value_heads \(3\)"):
        ModelConfig.from_hf({**base, "num_key_value_heads": 3})
    with pytest.raises(ModelLoadError, match="config.json has no low_freq_factor"):
        ModelConfig.from_hf({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(ModelLoadError, match="rope_theta must be a positive float, got 'big'"):
        ModelConfig.from_hf({**base, "rope_theta": "big"})
    with pytest.raises(ModelLoadError, match="token id must be an integer, got 'x'"):
        ModelConfig.from_hf({**base, "eos_token_id": ["x"]})
    assert ModelConfig.from_hf({**base, "rope_scaling": {"type": "linear", "factor": 2}}).rope_scaling == {
        "rope_type": "linear", "factor": 2.0}
    windowed = ModelConfig.from_hf({**base, "sliding_window": 128})
    assert windowed.max_position_embeddings == 128  # no sliding-window kernel: stay inside it
    assert ModelConfig.from_hf({**base, "eos_token_id": [7, 8]}).eos_token_id == 7
    untyped = {k: v for k, v in base.items() if k != "architectures"}
    assert ModelConfig.from_hf({**untyped, "model_type": "qwen2"}).attention_bias
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gpt2'"):
        ModelConfig.from_hf({**untyped, "model_type": "gpt2"})


FORBIDDEN = ("prometheus_client", "fastapi", "opentelemetry", "pynvml")


def test_model_package_imports_no_serving_or_metrics_libraries():
    """No import statement names them, and importing the package loads none beyond what torch does."""
    import ast
    from pathlib import Path

    import engine.model

    for path in Path(engine.model.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[0] in FORBIDDEN], f"{path.name} imports {names}"
    # torch.cuda itself imports pynvml when it is installed: compare against torch's own imports.
    code = (
        "import sys, torch, safetensors, tokenizers, jinja2\n"
        f"forbidden = {FORBIDDEN!r}\n"
        "before = {m for m in sys.modules if m.split('.')[0] in forbidden}\n"
        "import engine.model.loader, engine.model.llama, engine.model.attention, engine.model.tokenizer\n"
        "after = {m for m in sys.modules if m.split('.')[0] in forbidden}\n"
        "print(','.join(sorted(after - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
