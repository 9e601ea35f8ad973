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
