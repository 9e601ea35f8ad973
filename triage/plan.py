"""`llmtriage plan`: KV-cache arithmetic for a model on a GPU (bytes per token, budget, concurrency)."""

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
    """'80GiB', '80G' (binary), '80GB' (decimal), '81920MiB'; a bare number means GiB."""
    m = _SIZE.match(text)
    if m is None:
        raise PlanError(f"not a memory size: {text!r} (use e.g. 80GiB, 24G, 81920MiB)")
    value, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    if not unit:
        return int(value * GIB)
    power = "KMGT".index(unit) + 1
    decimal = text.strip().upper().endswith("B") and not binary and unit
    return int(value * (1000 ** power if decimal else 1024 ** power))


@dataclass(slots=True)
class ModelShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_params: int
    max_position_embeddings: int | None
    config_dtype: str | None


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
    q, kv = heads * head_dim, kv_heads * head_dim
    bias = (q + 2 * kv) if cfg.get("attention_bias", cfg.get("model_type") == "qwen2") else 0
    per_layer = hidden * (q + 2 * kv) + bias + q * hidden + 3 * hidden * inter + 2 * hidden
    embed = vocab * hidden
    lm_head = 0 if cfg.get("tie_word_embeddings") else vocab * hidden
    params = embed + layers * per_layer + hidden + lm_head
    return ModelShape(layers, kv_heads, head_dim, params, cfg.get("max_position_embeddings"), cfg.get("torch_dtype"))


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
    if not 0 < req.gpu_memory_utilization <= 1:
        raise PlanError("--gpu-memory-utilization must be in (0, 1]")
    if req.tensor_parallel_size < 1:
        raise PlanError("--tensor-parallel-size must be at least 1")
    shape = shape_of(load_config(req.model))
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
