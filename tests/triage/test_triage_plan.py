"""llmtriage plan: the KV arithmetic, checked against numbers worked out by hand."""

import json

import pytest

from triage.plan import PlanError, parse_size

QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
             "max_position_embeddings": 32768, "model_type": "qwen2", "num_attention_heads": 28,
             "num_hidden_layers": 28, "num_key_value_heads": 4, "tie_word_embeddings": False,
             "torch_dtype": "bfloat16", "vocab_size": 152064}


@pytest.fixture
def qwen(tmp_path):
    folder = tmp_path / "Qwen2.5-7B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN25_7B))
    return folder


def plan_json(run_cli, *argv):
    code, out, err = run_cli("plan", *argv, "--format", "json")
    return code, (json.loads(out) if out else None), err


def test_qwen25_7b_57344_bytes_per_token(run_cli, qwen):
    code, plan, _ = plan_json(run_cli, "--model", qwen, "--gpu-memory", "80GiB", "--dtype", "float16")
    assert code == 0
    assert plan["kv_bytes_per_token"] == 57_344  # 2 x 28 layers x 4 KV heads x 128 x 2 bytes
    # embed 544,997,376 + 28 x 233,057,792 per layer + final norm 3,584 + lm_head 544,997,376
    assert plan["num_params"] == 7_615_616_512
    assert plan["weights_bytes_per_gpu"] == 15_231_233_024
    assert plan["budget_bytes_per_gpu"] == 77_309_411_328  # 80 GiB x 0.9
    assert plan["kv_cache_bytes_per_gpu"] == 62_078_178_304
    assert plan["num_blocks"] == 67_659  # floor(62,078,178,304 / (57,344 x 16))
    assert plan["cache_tokens"] == 1_082_544
    assert plan["max_model_len"] == 32_768 and plan["fits"] is True
    assert plan["max_concurrency"] == pytest.approx(1_082_544 / 32_768)


def test_does_not_fit_suggests_flags(run_cli, qwen):
    code, plan, _ = plan_json(run_cli, "--model", qwen / "config.json", "--gpu-memory", "24GiB",
                              "--max-model-len", "200000", "--dtype", "bf16")
    assert code == 1 and plan["fits"] is False
    assert plan["cache_tokens"] == 138_832
    assert plan["suggestions"][0] == "--max-model-len 138832 (the longest sequence the KV cache holds)"
    assert any(s.startswith("--tensor-parallel-size 2") for s in plan["suggestions"])


def test_tensor_parallel_splits_kv_heads(run_cli, qwen):
    _, plan, _ = plan_json(run_cli, "--model", qwen, "--gpu-memory", "24GiB", "--tensor-parallel-size", "2",
                           "--dtype", "float16")
    assert plan["kv_bytes_per_token_per_gpu"] == 28_672
    assert plan["weights_bytes_per_gpu"] == 7_615_616_512


def test_weights_alone_too_big(run_cli, qwen):
    code, plan, _ = plan_json(run_cli, "--model", qwen, "--gpu-memory", "12GiB", "--dtype", "float32")
    assert code == 1 and plan["suggestions"][0].startswith("the weights alone (28.37 GiB per GPU) exceed the budget")


def test_text_output(run_cli, qwen):
    code, out, _ = run_cli("plan", "--model", qwen, "--gpu-memory", "80GiB", "--dtype", "float16")
    assert code == 0
    assert "KV bytes per token                57,344 (per GPU 57,344)" in out.splitlines()


def test_sizes():
    assert parse_size("80GiB") == 80 * 2**30 == parse_size("80G") == parse_size("80")
    assert parse_size("80GB") == 80 * 10**9
    assert parse_size("81920MiB") == 80 * 2**30
    with pytest.raises(PlanError):
        parse_size("lots")


def test_bad_plan_input_exit_2(run_cli, qwen, tmp_path):
    cases = [
        (("--model", tmp_path / "nope", "--gpu-memory", "80GiB"), f"llmtriage: no config.json at {tmp_path / 'nope'}"),
        (("--model", qwen, "--gpu-memory", "lots"), "llmtriage: not a memory size: 'lots' (use e.g. 80GiB, 24G, 81920MiB)"),
        (("--model", qwen, "--gpu-memory", "8G", "--dtype", "fp4"), "llmtriage: unknown dtype 'fp4'"),
        (("--model", qwen, "--gpu-memory", "8G", "--gpu-memory-utilization", "1.5"),
         "llmtriage: --gpu-memory-utilization must be in (0, 1]"),
    ]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    cases.append((("--model", bad, "--gpu-memory", "8G"), f"llmtriage: {bad / 'config.json'}: not a readable JSON"))
    for argv, message in cases:
        code, out, err = run_cli("plan", *argv)
        assert (code, out) == (2, "") and err.startswith(message) and err.count("\n") == 1


LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
             "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32,
             "num_hidden_layers": 32, "num_key_value_heads": 8, "tie_word_embeddings": False,
             "torch_dtype": "bfloat16", "vocab_size": 128256}


def _model(tmp_path, name, cfg):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize(("argv", "message"), [
    (("--block-size", "0"), "llmtriage: --block-size must be a positive number of tokens, got 0\n"),
    (("--block-size", "-16"), "llmtriage: --block-size must be a positive number of tokens, got -16\n"),
    (("--max-model-len", "-5"), "llmtriage: --max-model-len must be a positive number of tokens, got -5\n"),
    (("--max-model-len", "0"), "llmtriage: --max-model-len must be a positive number of tokens, got 0\n"),
    (("--tensor-parallel-size", "0"), "llmtriage: --tensor-parallel-size must be at least 1, got 0\n"),
    (("--gpu-memory-utilization", "nan"), "llmtriage: --gpu-memory-utilization must be in (0, 1]\n"),
    (("--gpu-memory-utilization", "0"), "llmtriage: --gpu-memory-utilization must be in (0, 1]\n"),
])
def test_impossible_numbers_are_refused_in_one_line(run_cli, qwen, argv, message):
    """--block-size 0 was a ZeroDivisionError; negative sizes gave negative blocks and 'fits: yes'."""
    assert run_cli("plan", "--model", qwen, "--gpu-memory", "80GiB", *argv) == (2, "", message)


@pytest.mark.parametrize(("size", "message"), [
    ("0", "memory size '0' is not more than 0 bytes"), ("0GiB", "memory size '0GiB' is not more than 0 bytes"),
    (".", "not a memory size: '.'"), ("1.2.3", "not a memory size: '1.2.3'")])
def test_impossible_memory_sizes(run_cli, qwen, size, message):
    code, out, err = run_cli("plan", "--model", qwen, "--gpu-memory", size)
    assert (code, out) == (2, "") and err.startswith(f"llmtriage: {message}") and err.count("\n") == 1


def test_tensor_parallel_must_split_the_attention_heads(run_cli, tmp_path):
    """vLLM: 'Total number of attention heads (32) must be divisible by tensor parallel size (3).'"""
    llama = _model(tmp_path, "Meta-Llama-3-8B", LLAMA3_8B)
    assert run_cli("plan", "--model", llama, "--gpu-memory", "80GiB", "--tensor-parallel-size", "3") == (
        2, "", "llmtriage: --tensor-parallel-size 3 does not divide the model's 32 attention heads (vLLM refuses it); "
               "sizes that split this model: 1, 2, 4, 8, 16, 32\n")


def test_tensor_parallel_must_split_or_replicate_the_kv_heads(run_cli, qwen, tmp_path):
    # 28 heads, 4 KV heads: 14 divides the heads, but 14 ranks cannot share 4 KV heads evenly
    code, out, err = run_cli("plan", "--model", qwen, "--gpu-memory", "80GiB", "--tensor-parallel-size", "14")
    assert (code, out, err) == (2, "", "llmtriage: --tensor-parallel-size 14 is not a multiple of the model's 4 KV "
                                       "heads (vLLM refuses it); sizes that split this model: 1, 2, 4, 28\n")
    # 12 heads, 6 KV heads: 4 divides the heads, not the KV heads
    odd = _model(tmp_path, "odd", {**LLAMA3_8B, "hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 6})
    code, _, err = run_cli("plan", "--model", odd, "--gpu-memory", "80GiB", "--tensor-parallel-size", "4")
    assert code == 2 and err.startswith("llmtriage: --tensor-parallel-size 4 does not divide the model's 6 KV heads")
    # more ranks than KV heads, a whole number of ranks per KV head: replicated, accepted
    code, plan, _ = plan_json(run_cli, "--model", qwen, "--gpu-memory", "80GiB", "--tensor-parallel-size", "28")
    assert code == 0 and plan["kv_bytes_per_token_per_gpu"] == 2 * 28 * 1 * 128 * 2


@pytest.mark.parametrize(("field", "value", "message"), [
    ("hidden_size", 0, "model config: hidden_size is 0, not a positive number"),
    ("num_hidden_layers", -2, "model config: num_hidden_layers is -2, not a positive number"),
    ("num_key_value_heads", 5, "model config: num_attention_heads 32 is not a multiple of num_key_value_heads 5"),
    ("max_position_embeddings", -1, "model config: max_position_embeddings is -1, not a positive whole number"),
    ("max_position_embeddings", "8k", "model config: max_position_embeddings is '8k', not a positive whole number"),
])
def test_impossible_model_configs(run_cli, tmp_path, field, value, message):
    model = _model(tmp_path, "m", {**LLAMA3_8B, field: value})
    assert run_cli("plan", "--model", model, "--gpu-memory", "80GiB") == (2, "", f"llmtriage: {message}\n")
