"""load_model: the built-in model or a Hugging Face checkpoint folder, checked against memory first."""

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from engine.core.config import EngineConfig
from engine.errors import ModelLoadError, OutOfMemoryError
from engine.model.builtin import (
    BUILTIN_CONFIG,
    BUILTIN_NAME,
    BUILTIN_SUPPRESS_TOKEN_IDS,
    build_builtin,
    builtin_digest,
    builtin_tokenizer,
)
from engine.model.llama import CausalLM, ModelConfig
from engine.model.tokenizer import HFTokenizer, Tokenizer, read_json

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GIB = 1024**3


@dataclass(slots=True)
class LoadedModel:
    model: CausalLM
    model_config: ModelConfig
    tokenizer: Tokenizer
    name: str
    digest: str
    weights_bytes: int
    suppress_token_ids: list[int] = field(default_factory=list)  # never sampled; never holds eos


def load_model(config: EngineConfig) -> LoadedModel:
    """`builtin` or a Hugging Face folder; ModelLoadError / OutOfMemoryError before allocating."""
    dtype = resolve_dtype(config.dtype)
    device = resolve_device(config.device)
    if config.model == BUILTIN_NAME:
        cfg = BUILTIN_CONFIG
        weights_bytes = cfg.num_params() * dtype.itemsize
        check_memory(weights_bytes, dtype, device, config.gpu_memory_utilization)
        model = build_builtin(dtype, device)
        return LoadedModel(model, cfg, builtin_tokenizer(), BUILTIN_NAME, builtin_digest(), weights_bytes,
                           list(BUILTIN_SUPPRESS_TOKEN_IDS))
    folder = Path(config.model).expanduser()
    if not folder.exists():
        raise ModelLoadError(f"model folder {folder} does not exist (use 'builtin' or a Hugging Face checkpoint folder)")
    if not folder.is_dir():
        raise ModelLoadError(f"model {folder} is not a folder (give the checkpoint folder, not a file in it)")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{folder}: no config.json, not a Hugging Face checkpoint folder")
    cfg = ModelConfig.from_hf(read_json(config_path))
    files = weight_files(folder)
    weights_bytes = cfg.num_params() * dtype.itemsize
    check_memory(weights_bytes, dtype, device, config.gpu_memory_utilization)
    tokenizer = HFTokenizer(folder, cfg.eos_token_id)
    suppress_ids = read_suppress_token_ids(folder, cfg.vocab_size, {cfg.eos_token_id, tokenizer.eos_token_id})
    model = load_weights(cfg, files, dtype, device)
    name = folder.resolve().name
    return LoadedModel(model, cfg, tokenizer, name, checkpoint_digest(config_path, files), weights_bytes,
                       suppress_ids)


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ModelLoadError(f"unsupported dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ModelLoadError(f"bad device {name!r}: expected cpu, cuda or cuda:N") from exc
    if device.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"unsupported device {name!r}: expected cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {name!r} requested but CUDA is not available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) present")
    return device


def memory_budget(device: torch.device, gpu_memory_utilization: float | None) -> tuple[int | None, str]:
    """Bytes the weights may take, and where that number comes from (None: unknown, no check)."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        if gpu_memory_utilization is None:
            return total, "total device memory"
        return int(total * gpu_memory_utilization), f"device memory x gpu_memory_utilization {gpu_memory_utilization}"
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except OSError:
        pass
    return None, "unknown"


def check_memory(weights_bytes: int, dtype: torch.dtype, device: torch.device, gpu_util: float | None) -> None:
    """OutOfMemoryError before any allocation when the weights alone exceed the budget."""
    budget, source = memory_budget(device, gpu_util)
    if budget is None or weights_bytes <= budget:
        return
    advice = "a smaller dtype (bfloat16 or float16), a smaller model, or a device with more memory"
    if dtype.itemsize == 2:
        advice = "a smaller model or a device with more memory"
    if device.type == "cuda":
        advice += " (or a higher --gpu-memory-utilization)" if gpu_util is not None and gpu_util < 1 else ""
    raise OutOfMemoryError(
        f"model weights need {weights_bytes / GIB:.2f} GiB in {str(dtype).removeprefix('torch.')}, "
        f"more than the {budget / GIB:.2f} GiB available on {device} ({source}); try {advice}"
    )


def weight_files(folder: Path) -> list[Path]:
    """model.safetensors, or the shards listed in model.safetensors.index.json."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index}: no weight_map")
        files = [folder / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"{folder}: no *.safetensors weights (.bin checkpoints are not supported)")
    for path in files:
        if not path.is_file():
            raise ModelLoadError(f"{folder}: weight file {path.name} listed in the index is missing")
    return files


def load_weights(cfg: ModelConfig, files: list[Path], dtype: torch.dtype, device: torch.device) -> CausalLM:
    """Build on the meta device, then assign each tensor converted once: peak memory ~ the model."""
    with torch.device("meta"):
        model = CausalLM(cfg)
    expected = model.state_dict()
    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name not in expected:
                        if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and cfg.tie_word_embeddings):
                            continue
                        raise ModelLoadError(f"{path.name}: unexpected tensor {name} for {type(model).__name__}")
                    tensor = f.get_tensor(name)
                    if tensor.shape != expected[name].shape:
                        raise ModelLoadError(
                            f"{path.name}: tensor {name} has shape {tuple(tensor.shape)}, "
                            f"config.json implies {tuple(expected[name].shape)}"
                        )
                    state[name] = tensor.to(device=device, dtype=dtype)
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"{path}: cannot read safetensors: {exc}") from exc
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ModelLoadError(f"checkpoint lacks {len(missing)} tensor(s), e.g. {', '.join(missing[:3])}")
    model.load_state_dict(state, assign=True, strict=False)
    model.tie_weights()
    return model.eval()


def read_suppress_token_ids(folder: Path, vocab_size: int, eos_token_ids: set[int | None]) -> list[int]:
    """`suppress_tokens` of generation_config.json, as Hugging Face reads it (no file or key: none).

    Eos is dropped from the list: a request must always be able to stop on its own.
    """
    path = folder / "generation_config.json"
    if not path.is_file():
        return []
    ids = read_json(path).get("suppress_tokens") or []
    if not isinstance(ids, list) or any(type(i) is not int or not 0 <= i < vocab_size for i in ids):
        raise ModelLoadError(f"{path}: suppress_tokens must be a list of token ids in 0..{vocab_size - 1}")
    return sorted(set(ids) - eos_token_ids)


def checkpoint_digest(config_path: Path, files: list[Path]) -> str:
    """Short sha256 over config.json and every weight file's bytes."""
    h = hashlib.sha256(config_path.read_bytes())
    for path in files:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()[:12]
