"""`llmtriage plan`: KV-cache arithmetic for a model on a GPU (bytes per token, budget, concurrency)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

GIB = 1 << 30
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2,
               "bf16": 2, "fp8": 1, "float8": 1, "int8": 1}
_SIZE = re.compile(r"^\s*([\d.]+)\s*([kKmMgGtT]?)(i?)[bB]?\s*$")


class PlanError(Exception):
    """Bad planner input: a missing config, an unknown dtype, an unreadable size."""


def parse_size(text: str) -> int:
    """'80GiB', '80G' (binary), '80GB' (decimal), '81920MiB'; a bare number means GiB. Never 0 bytes."""
    m = _SIZE.match(text)
    try:
        value = float(m.group(1)) if m else math.nan
    except ValueError:  # '.', '1.2.3'
        value = math.nan
    if m is None or not math.isfinite(value):
        raise PlanError(f"not a memory size: {text!r} (use e.g. 80GiB, 24G, 81920MiB)")
    unit, binary = m.group(2).upper(), m.group(3)
    if not unit:
        size = int(value * GIB)
    else:
        power = "KMGT".index(unit) + 1
        decimal = text.strip().upper().endswith("B") and not binary and unit
        size = int(value * (1000 ** power if decimal else 1024 ** power))
    if size <= 0:
        raise PlanError(f"memory size {text!r} is not more than 0 bytes")
    return size


@dataclass(slots=True)
class ModelShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_params: int
    max_position_embeddings: int | None
    config_dtype: str | None
    num_heads: int = 0  # attention (query) heads


def load_config(path: str) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise PlanError(f"no config.json at {p}") from exc
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PlanError(f"{p}: not a readable JSON config ({exc.__class__.__name__})") from exc
    if not isinstance(doc, dict):
        raise PlanError(f"{p}: not a model config object")
    return doc.get("text_config", doc) if isinstance(doc.get("text_config"), dict) else doc


def shape_of(cfg: dict) -> ModelShape:
    """Llama/Qwen2-style decoder: parameter count from the config's sizes."""
    try:
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        inter = int(cfg.get("intermediate_size") or 4 * hidden)
        vocab = int(cfg.get("vocab_size") or 0)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise PlanError(f"model config lacks a usable {exc} field (hidden_size, num_hidden_layers, "
                        "num_attention_heads)") from exc
    sizes = {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
             "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": inter}
    for name, value in sizes.items():
        if value <= 0:
            raise PlanError(f"model config: {name} is {value}, not a positive number")
    if vocab < 0:
        raise PlanError(f"model config: vocab_size is {vocab}, not a positive number")
    if heads % kv_heads:
        raise PlanError(f"model config: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    max_pos = cfg.get("max_position_embeddings")
    if max_pos is not None and (isinstance(max_pos, bool) or not isinstance(max_pos, int) or max_pos <= 0):
        raise PlanError(f"model config: max_position_embeddings is {max_pos!r}, not a positive whole number")
    q, kv = heads * head_dim, kv_heads * head_dim
    bias = (q + 2 * kv) if cfg.get("attention_bias", cfg.get("model_type") == "qwen2") else 0
    per_layer = hidden * (q + 2 * kv) + bias + q * hidden + 3 * hidden * inter + 2 * hidden
    embed = vocab * hidden
    lm_head = 0 if cfg.get("tie_word_embeddings") else vocab * hidden
    params = embed + layers * per_layer + hidden + lm_head
    return ModelShape(layers, kv_heads, head_dim, params, max_pos, cfg.get("torch_dtype"), heads)


def tp_sizes(shape: ModelShape, limit: int = 64) -> list[int]:
    """Tensor-parallel sizes up to limit that split this model as vLLM does: the attention heads
    evenly, and the KV heads evenly (fewer ranks than KV heads) or each KV head over a whole number
    of ranks (more ranks than KV heads: replicated)."""
    return [tp for tp in range(1, limit + 1) if splits(shape, tp)]


def splits(shape: ModelShape, tp: int) -> bool:
    kv = shape.num_kv_heads
    return shape.num_heads % tp == 0 and (kv % tp == 0 if tp < kv else tp % kv == 0)


def _check_request(req: PlanRequest) -> None:
    """Refuse numbers no engine could run with, before any arithmetic."""
    if not req.gpu_memory_utilization > 0 or not req.gpu_memory_utilization <= 1:
        raise PlanError("--gpu-memory-utilization must be in (0, 1]")
    if req.tensor_parallel_size < 1:
        raise PlanError(f"--tensor-parallel-size must be at least 1, got {req.tensor_parallel_size}")
    if req.block_size < 1:
        raise PlanError(f"--block-size must be a positive number of tokens, got {req.block_size}")
    if req.max_model_len is not None and req.max_model_len < 1:
        raise PlanError(f"--max-model-len must be a positive number of tokens, got {req.max_model_len}")
    if req.gpu_memory <= 0:
        raise PlanError(f"--gpu-memory must be more than 0 bytes, got {req.gpu_memory}")


def _check_tensor_parallel(shape: ModelShape, tp: int) -> None:
    if splits(shape, tp):
        return
    heads, kv = shape.num_heads, shape.num_kv_heads
    if heads % tp:
        why = f"does not divide the model's {heads} attention heads"
    elif tp < kv:
        why = f"does not divide the model's {kv} KV heads"
    else:
        why = f"is not a multiple of the model's {kv} KV heads"
    valid = ", ".join(map(str, tp_sizes(shape)))
    raise PlanError(f"--tensor-parallel-size {tp} {why} (vLLM refuses it); sizes that split this model: {valid}")


@dataclass(slots=True)
class PlanRequest:
    model: str
    gpu_memory: int
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    block_size: int = 16


@dataclass(slots=True)
class Plan:
    dtype: str
    num_params: int
    kv_bytes_per_token: int  # whole model, all layers
    kv_bytes_per_token_per_gpu: int
    weights_bytes_per_gpu: int
    budget_bytes_per_gpu: int
    kv_cache_bytes_per_gpu: int
    cache_tokens: int
    num_blocks: int
    max_model_len: int
    max_concurrency: float
    fits: bool
    suggestions: list[str]

    def to_json(self) -> dict:
        return asdict(self)


def make_plan(req: PlanRequest) -> Plan:
    _check_request(req)
    shape = shape_of(load_config(req.model))
    _check_tensor_parallel(shape, req.tensor_parallel_size)
    dtype = req.dtype if req.dtype != "auto" else (shape.config_dtype or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise PlanError(f"unknown dtype {dtype!r} (one of {', '.join(sorted(DTYPE_BYTES))})")
    nbytes = DTYPE_BYTES[dtype]
    tp = req.tensor_parallel_size
    kv_per_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * nbytes
    # KV heads are split across tensor-parallel ranks; with fewer heads than ranks they are replicated.
    kv_per_token_gpu = 2 * shape.num_layers * max(1, shape.num_kv_heads // tp) * shape.head_dim * nbytes
    weights_gpu = math.ceil(shape.num_params * nbytes / tp)
    budget = int(req.gpu_memory * req.gpu_memory_utilization)
    kv_bytes = max(0, budget - weights_gpu)
    num_blocks = kv_bytes // (kv_per_token_gpu * req.block_size)
    tokens = num_blocks * req.block_size
    max_len = req.max_model_len or shape.max_position_embeddings or 4096
    fits = tokens >= max_len and weights_gpu < budget
    plan = Plan(dtype, shape.num_params, kv_per_token, kv_per_token_gpu, weights_gpu, budget, kv_bytes, tokens,
                num_blocks, max_len, tokens / max_len if max_len else 0.0, fits, [])
    plan.suggestions = _suggest(plan, req)
    return plan


def _suggest(plan: Plan, req: PlanRequest) -> list[str]:
    if plan.fits:
        return []
    out = []
    if plan.weights_bytes_per_gpu >= plan.budget_bytes_per_gpu:
        out.append(f"the weights alone ({plan.weights_bytes_per_gpu / GIB:.2f} GiB per GPU) exceed the budget: "
                   f"--tensor-parallel-size {req.tensor_parallel_size * 2}, a quantized checkpoint, or a bigger GPU")
        return out
    if plan.cache_tokens > 0:
        fit_len = plan.cache_tokens - plan.cache_tokens % req.block_size
        out.append(f"--max-model-len {fit_len} (the longest sequence the KV cache holds)")
    need = plan.weights_bytes_per_gpu + plan.max_model_len * plan.kv_bytes_per_token_per_gpu
    util = need / req.gpu_memory
    if util <= 0.98:
        out.append(f"--gpu-memory-utilization {math.ceil(util * 100) / 100:.2f} (fits max_model_len "
                   f"{plan.max_model_len})")
    out.append(f"--tensor-parallel-size {req.tensor_parallel_size * 2} (splits weights and KV heads)")
    out.append("--kv-cache-dtype fp8 (halves the KV bytes per token)")
    return out


def render_plan(plan: Plan) -> str:
    rows = [
        ("dtype", plan.dtype),
        ("parameters", f"{plan.num_params / 1e9:.2f} B"),
        ("KV bytes per token", f"{plan.kv_bytes_per_token:,} (per GPU {plan.kv_bytes_per_token_per_gpu:,})"),
        ("weights per GPU", f"{plan.weights_bytes_per_gpu / GIB:.2f} GiB"),
        ("memory budget per GPU", f"{plan.budget_bytes_per_gpu / GIB:.2f} GiB"),
        ("KV cache per GPU", f"{plan.kv_cache_bytes_per_gpu / GIB:.2f} GiB"),
        ("tokens the cache holds", f"{plan.cache_tokens:,} ({plan.num_blocks:,} blocks)"),
        ("max_model_len", f"{plan.max_model_len:,}"),
        ("max concurrency at max_model_len", f"{plan.max_concurrency:.2f}x"),
        ("max_model_len fits", "yes" if plan.fits else "NO"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if plan.suggestions:
        lines.append("to make it fit, change one of:")
        lines.extend(f"  {s}" for s in plan.suggestions)
    return "\n".join(lines) + "\n"
