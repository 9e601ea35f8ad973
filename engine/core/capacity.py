"""KV cache budget: how many blocks fit, the start-up capacity report and vLLM's refusal message."""

from dataclasses import dataclass

import torch

from engine import errors

GiB = 1 << 30
MiB = 1 << 20
CPU_DEFAULT_KV_CACHE_MEMORY = 512 * MiB
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


@dataclass(slots=True)
class CapacityReport:
    kv_bytes_per_token: int  # 2 (K and V) x layers x kv_heads x head_dim x dtype bytes
    block_size: int
    num_blocks: int
    num_cache_tokens: int
    max_concurrency: float  # sequences of max_model_len tokens the cache holds at once
    max_model_len: int
    kv_cache_bytes: int
    weights_bytes: int
    dtype: str
    device: str


@dataclass(slots=True)
class MemoryBudget:
    """What the KV cache may use, and where that figure came from (for the error messages)."""

    kv_cache_bytes: int
    num_blocks: int
    source: str  # num_kv_blocks | kv_cache_memory | gpu_memory_utilization | cpu_default


def kv_budget(
    *,
    block_bytes: int,
    num_kv_blocks: int | None,
    kv_cache_memory: int | None,
    gpu_memory_utilization: float | None,
    device_total_bytes: int | None,
    weights_bytes: int,
    activation_peak_bytes: int,
) -> MemoryBudget:
    """Decide the number of KV blocks: num_kv_blocks wins, then kv_cache_memory, then
    gpu_memory_utilization of the device (minus weights and the measured activation peak);
    with none given, a CPU default of 512 MiB (or 0.9 of a CUDA device)."""
    if num_kv_blocks is not None:
        if num_kv_blocks < 1:
            raise errors.ConfigError(f"num_kv_blocks must be at least 1, got {num_kv_blocks}")
        return MemoryBudget(num_kv_blocks * block_bytes, num_kv_blocks, "num_kv_blocks")
    if kv_cache_memory is not None:
        if kv_cache_memory < 1:
            raise errors.ConfigError(f"kv_cache_memory must be a positive number of bytes, got {kv_cache_memory}")
        return MemoryBudget(kv_cache_memory, kv_cache_memory // block_bytes, "kv_cache_memory")
    if device_total_bytes is None:
        if gpu_memory_utilization is not None:
            raise errors.ConfigError("gpu_memory_utilization needs a CUDA device; use kv_cache_memory on CPU")
        return MemoryBudget(CPU_DEFAULT_KV_CACHE_MEMORY, CPU_DEFAULT_KV_CACHE_MEMORY // block_bytes, "cpu_default")
    utilization = DEFAULT_GPU_MEMORY_UTILIZATION if gpu_memory_utilization is None else gpu_memory_utilization
    if not 0.0 < utilization <= 1.0:
        raise errors.ConfigError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    budget = int(device_total_bytes * utilization)
    if weights_bytes > budget:
        raise errors.OutOfMemoryError(
            f"Model weights take {weights_bytes / GiB:.2f} GiB, more than the memory budget of "
            f"{budget / GiB:.2f} GiB (gpu_memory_utilization {utilization} of "
            f"{device_total_bytes / GiB:.2f} GiB). Try increasing --gpu-memory-utilization or a smaller "
            f"model or dtype."
        )
    available = max(0, budget - weights_bytes - activation_peak_bytes)
    return MemoryBudget(available, available // block_bytes, "gpu_memory_utilization")


def check_fits(
    *, max_model_len: int, block_size: int, num_blocks: int, kv_bytes_per_token: int, kv_cache_bytes: int
) -> None:
    """Refuse to start when one max_model_len sequence does not fit, in vLLM's wording."""
    if num_blocks < 1:
        raise errors.CapacityError(
            "No available memory for the cache blocks. Try increasing --kv-cache-memory / "
            "--num-kv-blocks / --gpu-memory-utilization."
        )
    blocks_needed = -(-max_model_len // block_size)
    if blocks_needed <= num_blocks:
        return
    needed_bytes = blocks_needed * block_size * kv_bytes_per_token
    estimated_max_len = num_blocks * block_size
    raise errors.CapacityError(
        f"To serve at least one request with the model's max seq len ({max_model_len}), "
        f"{needed_bytes / GiB:.2f} GiB KV cache is needed, which is larger than the available KV cache "
        f"memory ({kv_cache_bytes / GiB:.2f} GiB). Based on the available memory, the estimated maximum "
        f"model length is {estimated_max_len}. Try increasing --kv-cache-memory / --num-kv-blocks / "
        f"--gpu-memory-utilization or decreasing --max-model-len."
    )


def make_report(
    *, kv_bytes_per_token: int, block_size: int, num_blocks: int, max_model_len: int,
    weights_bytes: int, dtype: str, device: str,
) -> CapacityReport:
    num_cache_tokens = num_blocks * block_size
    return CapacityReport(
        kv_bytes_per_token=kv_bytes_per_token,
        block_size=block_size,
        num_blocks=num_blocks,
        num_cache_tokens=num_cache_tokens,
        max_concurrency=num_cache_tokens / max_model_len,
        max_model_len=max_model_len,
        kv_cache_bytes=num_blocks * block_size * kv_bytes_per_token,
        weights_bytes=weights_bytes,
        dtype=dtype,
        device=device,
    )


def plan(config, loaded, max_model_len: int, dtype: torch.dtype, device: torch.device) -> CapacityReport:
    """The engine's KV budget for a loaded model: blocks, the fit check, the start-up report."""
    kv_bytes_per_token = loaded.model_config.kv_bytes_per_token(dtype.itemsize)
    on_cuda = device.type == "cuda"
    from_device = on_cuda and config.num_kv_blocks is None and config.kv_cache_memory is None
    budget = kv_budget(
        block_bytes=kv_bytes_per_token * config.block_size,
        num_kv_blocks=config.num_kv_blocks,
        kv_cache_memory=config.kv_cache_memory,
        gpu_memory_utilization=config.gpu_memory_utilization,
        device_total_bytes=torch.cuda.get_device_properties(device).total_memory if on_cuda else None,
        weights_bytes=loaded.weights_bytes,
        activation_peak_bytes=measure_activation_peak(loaded, config, device) if from_device else 0,
    )
    check_fits(
        max_model_len=max_model_len, block_size=config.block_size, num_blocks=budget.num_blocks,
        kv_bytes_per_token=kv_bytes_per_token, kv_cache_bytes=budget.kv_cache_bytes,
    )
    return make_report(
        kv_bytes_per_token=kv_bytes_per_token, block_size=config.block_size, num_blocks=budget.num_blocks,
        max_model_len=max_model_len, weights_bytes=loaded.weights_bytes,
        dtype=str(dtype).removeprefix("torch."), device=str(device),
    )


def measure_activation_peak(loaded, config, device) -> int:
    """CUDA only: peak bytes of one prefill forward of max_num_batched_tokens, beyond weights and KV."""
    from engine.core.runner import allocate_kv_caches
    from engine.model.attention import AttentionMetadata

    num_tokens = config.max_num_batched_tokens
    block_size = config.block_size
    num_blocks = -(-num_tokens // block_size)
    dtype = next(loaded.model.parameters()).dtype
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    kv_caches = allocate_kv_caches(loaded.model_config, num_blocks, block_size, dtype, device)
    cache_bytes = torch.cuda.memory_allocated(device) - before
    attn = AttentionMetadata(
        slot_mapping=torch.arange(num_tokens, device=device),
        query_start_loc=[0, num_tokens],
        context_lens=torch.tensor([num_tokens], device=device),
        block_tables=torch.arange(num_blocks, device=device)[None, :],
        block_size=block_size,
        is_decode_only=num_tokens == 1,
    )
    ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
    loaded.model(ids, torch.arange(num_tokens, device=device), kv_caches, attn)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before - cache_bytes
    del kv_caches
    torch.cuda.empty_cache()
    return max(0, peak)
