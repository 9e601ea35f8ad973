"""Engine configuration: one dataclass, validated once at start-up."""

from dataclasses import dataclass

from engine.core.faults import FaultConfig


@dataclass(slots=True)
class EngineConfig:
    model: str = "builtin"  # "builtin" or a Hugging Face checkpoint folder
    dtype: str = "float32"  # float32 | bfloat16 | float16
    device: str = "cpu"  # cpu | cuda | cuda:N
    seed: int = 0
    block_size: int = 16
    # KV budget: exactly one of these decides the number of blocks (num_kv_blocks wins, then
    # kv_cache_memory in bytes, then gpu_memory_utilization on CUDA; else a CPU default).
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None  # None: the model's own limit
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    log_stats: bool = True
    faults: FaultConfig | None = None  # test-only fault injection (CONTRACTS section 6)
