"""Prometheus text exposition snapshots and nvidia-smi output, as metric and GPU events."""

import re

from triage.model import Event

# Engine series of this project, vLLM, SGLang, TGI and llama-server, under one canonical name each.
METRIC_ALIASES = {
    "llm_preemptions_total": "preemptions_total", "vllm:num_preemptions_total": "preemptions_total",
    "vllm:num_preemptions": "preemptions_total", "sglang:num_retracted_reqs": "retracted",
    "llm_requests_waiting": "waiting", "vllm:num_requests_waiting": "waiting",
    "sglang:num_queue_reqs": "waiting", "tgi_queue_size": "waiting",
    "llamacpp:requests_deferred": "waiting", "llamacpp:requests_processing": "running",  # (llama-server /metrics)
    "llamacpp:kv_cache_usage_ratio": "kv_usage",
    "llm_requests_running": "running", "vllm:num_requests_running": "running",
    "sglang:num_running_reqs": "running",
    "llm_kv_cache_usage_ratio": "kv_usage", "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage", "sglang:token_usage": "kv_usage",
    "llm_prefix_cache_queried_tokens_total": "prefix_queries_total",
    "vllm:prefix_cache_queries_total": "prefix_queries_total",
    "vllm:gpu_prefix_cache_queries_total": "prefix_queries_total",
    "llm_prefix_cache_hit_tokens_total": "prefix_hits_total", "vllm:prefix_cache_hits_total": "prefix_hits_total",
    "vllm:gpu_prefix_cache_hits_total": "prefix_hits_total",
    "sglang:cache_hit_rate": "prefix_hit_rate",
    "llm_prompt_tokens_total": "prompt_tokens_total", "vllm:prompt_tokens_total": "prompt_tokens_total",
    "llm_engine_info": "engine_info", "vllm:cache_config_info": "engine_info",
    "llm_requests_finished_total": "finished_total", "vllm:request_success_total": "finished_total",
    "llm_requests_rejected_total": "rejected_total", "up": "up", "llm_engine_ready": "ready",
}
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>[-+\w.]+)(?:\s+\d+)?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_SMI_HEAD = re.compile(r"NVIDIA-SMI (?P<smi>[\d.]+)\s+Driver Version: (?P<driver>[\d.]+)\s+CUDA Version: (?P<cuda>[\d.]+)")
_SMI_MEM = re.compile(r"\|\s+(?P<used>\d+)MiB / (?P<total>\d+)MiB\s+\|")
# triage.parsers.MAKES: a sample line starts with its series' name ("up" alone would be a word in any
# line: anchored); HELP and TYPE lines tell that a file is an exposition
MAKES = (
    ("metric", "prometheus", ("# HELP ", "# TYPE ", *(n for n in METRIC_ALIASES if n != "up")), (r"^up[{ ]",)),
    ("gpu.driver", "nvidia-smi", ("NVIDIA-SMI",), ()),
    ("gpu.memory", "nvidia-smi", ("MiB /",), ()),
)


def metric_event(metric: str, labels: dict, values: list[tuple[float, float]], file: str,
                 lineno: int | None, text: str, ts=None) -> Event:
    """One series (or one snapshot sample) summarised: first, last, min, max and counter increase."""
    vals = [v for _, v in values]
    increase = 0.0
    for prev, cur in zip(vals, vals[1:], strict=False):
        increase += cur - prev if cur >= prev else cur  # a counter reset restarts from zero
    fields = {"metric": metric, "labels": labels, "first": vals[0], "last": vals[-1], "min": min(vals),
              "max": max(vals), "increase": increase if len(vals) > 1 else vals[0], "num_points": len(vals),
              "values": values}
    return Event(ts, "prometheus", "metric", fields, file, lineno, text)


def parse_sample(line: str, file: str, lineno: int) -> Event | None | bool:
    """An event for a known series; True for any other exposition line; None when not exposition."""
    if line.startswith("# HELP ") or line.startswith("# TYPE "):
        return True
    m = _SAMPLE.match(line)
    if m is None:
        return None
    try:
        value = float(m.group("value"))
    except ValueError:
        return None
    metric = METRIC_ALIASES.get(m.group("name"))
    if metric is None:
        return True
    labels = dict(_LABEL.findall(m.group("labels") or ""))
    return metric_event(metric, labels, [(0.0, value)], file, lineno, line)


def parse_nvidia_smi(line: str, file: str, lineno: int) -> Event | None:
    if "NVIDIA-SMI" in line and (m := _SMI_HEAD.search(line)):
        return Event(None, "nvidia-smi", "gpu.driver", m.groupdict(), file, lineno, line)
    if "MiB /" in line and (m := _SMI_MEM.search(line)):
        used, total = int(m.group("used")), int(m.group("total"))
        fields = {"used_mib": used, "total_mib": total, "ratio": used / total if total else 0.0}
        return Event(None, "nvidia-smi", "gpu.memory", fields, file, lineno, line)
    return None
