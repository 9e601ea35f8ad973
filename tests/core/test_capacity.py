"""KV budget, the start-up capacity report and the vLLM-worded refusal."""

import pytest

from engine import errors
from engine.core import capacity
from engine.core.capacity import GiB, MiB


def test_report_numbers_follow_from_the_model_shape(make_engine):
    engine = make_engine(num_kv_blocks=40, block_size=4, max_model_len=32)
    report = engine.capacity
    # tiny model: 2 (K, V) x 2 layers x 2 kv heads x 16 head_dim x 8 bytes (float64)
    assert report.kv_bytes_per_token == 2 * 2 * 2 * 16 * 8
    assert (report.num_blocks, report.num_cache_tokens, report.max_concurrency) == (40, 160, 5.0)
    assert report.kv_cache_bytes == 160 * report.kv_bytes_per_token
    assert engine.runner.kv_caches[0][0].shape == (40, 4, 2, 16)
    assert len(engine.runner.kv_caches) == 2


def test_kv_cache_memory_decides_the_block_count(make_engine):
    engine = make_engine(num_kv_blocks=None, kv_cache_memory=1 * MiB, block_size=4)
    assert engine.capacity.num_blocks == MiB // (4 * 1024)


def test_refusal_names_both_numbers_and_the_flags(make_engine):
    with pytest.raises(errors.CapacityError) as info:
        make_engine(num_kv_blocks=7, block_size=4, max_model_len=32)
    message = str(info.value)
    assert message.startswith("To serve at least one request with the model's max seq len (32), ")
    assert "the estimated maximum model length is 28." in message
    assert "--kv-cache-memory / --num-kv-blocks / --gpu-memory-utilization or decreasing --max-model-len" in message


def test_refusal_in_vllm_wording_with_gib_figures():
    with pytest.raises(errors.CapacityError) as info:
        capacity.check_fits(
            max_model_len=131072, block_size=16, num_blocks=(int(10.91 * GiB) // (16 * 196608)),
            kv_bytes_per_token=196608, kv_cache_bytes=int(10.91 * GiB),
        )
    assert str(info.value) == (
        "To serve at least one request with the model's max seq len (131072), 24.00 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (10.91 GiB). Based on the available memory, the "
        "estimated maximum model length is 59568. Try increasing --kv-cache-memory / --num-kv-blocks / "
        "--gpu-memory-utilization or decreasing --max-model-len."
    )


def test_gpu_budget_subtracts_weights_and_activation_peak():
    budget = capacity.kv_budget(
        block_bytes=1 * MiB, num_kv_blocks=None, kv_cache_memory=None, gpu_memory_utilization=0.5,
        device_total_bytes=80 * GiB, weights_bytes=16 * GiB, activation_peak_bytes=2 * GiB,
    )
    assert (budget.kv_cache_bytes, budget.num_blocks, budget.source) == (22 * GiB, 22 * 1024, "gpu_memory_utilization")


def test_weights_larger_than_the_budget_fail_with_out_of_memory():
    with pytest.raises(errors.OutOfMemoryError, match=r"weights take 40\.00 GiB, more than the memory budget of 36\.00 GiB"):
        capacity.kv_budget(
            block_bytes=MiB, num_kv_blocks=None, kv_cache_memory=None, gpu_memory_utilization=0.45,
            device_total_bytes=80 * GiB, weights_bytes=40 * GiB, activation_peak_bytes=0,
        )


def test_cpu_default_and_bad_settings():
    default = capacity.kv_budget(
        block_bytes=MiB, num_kv_blocks=None, kv_cache_memory=None, gpu_memory_utilization=None,
        device_total_bytes=None, weights_bytes=0, activation_peak_bytes=0,
    )
    assert (default.kv_cache_bytes, default.num_blocks, default.source) == (512 * MiB, 512, "cpu_default")
    with pytest.raises(errors.ConfigError, match="needs a CUDA device"):
        capacity.kv_budget(
            block_bytes=MiB, num_kv_blocks=None, kv_cache_memory=None, gpu_memory_utilization=0.9,
            device_total_bytes=None, weights_bytes=0, activation_peak_bytes=0,
        )
    with pytest.raises(errors.ConfigError, match="num_kv_blocks must be at least 1"):
        capacity.kv_budget(
            block_bytes=MiB, num_kv_blocks=0, kv_cache_memory=None, gpu_memory_utilization=None,
            device_total_bytes=None, weights_bytes=0, activation_peak_bytes=0,
        )


def test_bad_engine_config_is_a_config_error(make_engine):
    with pytest.raises(errors.ConfigError, match=r"User-specified max_model_len \(9999\) is greater"):
        make_engine(max_model_len=9999)
    with pytest.raises(errors.ConfigError, match="block_size must be a positive integer"):
        make_engine(block_size=0)
    with pytest.raises(errors.ConfigError, match="kv_cache_memory must be an integer, got '2GiB'"):
        make_engine(num_kv_blocks=None, kv_cache_memory="2GiB")
