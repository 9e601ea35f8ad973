"""Prometheus HTTP API (/api/v1/query_range) over the incident window, turned into metric events."""

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime

from triage.model import Event
from triage.parsers.metrics_text import metric_event

ENGINE_UP = 'up{job=~".*(llm-engine|vllm|sglang|tgi|llmserve).*"}'
QUERIES: tuple[tuple[str, str], ...] = (
    ("preemptions_total", "llm_preemptions_total"), ("preemptions_total", "vllm:num_preemptions_total"),
    ("waiting", "llm_requests_waiting"), ("waiting", "vllm:num_requests_waiting"),
    ("running", "llm_requests_running"), ("running", "vllm:num_requests_running"),
    ("kv_usage", "llm_kv_cache_usage_ratio"), ("kv_usage", "vllm:kv_cache_usage_perc"),
    ("prefix_queries_total", "llm_prefix_cache_queried_tokens_total"),
    ("prefix_queries_total", "vllm:prefix_cache_queries_total"),
    ("prefix_hits_total", "llm_prefix_cache_hit_tokens_total"), ("prefix_hits_total", "vllm:prefix_cache_hits_total"),
    ("prompt_tokens_total", "llm_prompt_tokens_total"), ("prompt_tokens_total", "vllm:prompt_tokens_total"),
    ("finished_total", "llm_requests_finished_total"), ("finished_total", "vllm:request_success_total"),
    ("rejected_total", "llm_requests_rejected_total"),
    ("engine_info", "llm_engine_info"), ("engine_info", "vllm:cache_config_info"),
    ("ready", "llm_engine_ready"), ("up", ENGINE_UP),
)
MAX_POINTS = 1000


class PrometheusError(Exception):
    """The Prometheus API could not be reached or answered with an error."""


def _get(url: str, timeout_s: float) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (user-given URL)
            doc = json.loads(resp.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        raise PrometheusError(f"HTTP {exc.code} from {url.split('?')[0]}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PrometheusError(f"cannot reach {url.split('?')[0]}: {reason}") from exc
    except ValueError as exc:
        raise PrometheusError(f"not a Prometheus API answer from {url.split('?')[0]}") from exc
    if not isinstance(doc, dict) or doc.get("status") != "success":
        error = doc.get("error", "unexpected answer") if isinstance(doc, dict) else "unexpected answer"
        raise PrometheusError(f"query failed: {error}")
    return doc


def query_range(base: str, promql: str, start: datetime, end: datetime, timeout_s: float = 5.0) -> list[dict]:
    start_s = start.replace(tzinfo=UTC).timestamp()
    end_s = max(end.replace(tzinfo=UTC).timestamp(), start_s + 1)
    step = max(1, math.ceil((end_s - start_s) / MAX_POINTS))
    params = urllib.parse.urlencode({"query": promql, "start": start_s, "end": end_s, "step": step})
    doc = _get(f"{base.rstrip('/')}/api/v1/query_range?{params}", timeout_s)
    result = doc.get("data", {}).get("result", [])
    return result if isinstance(result, list) else []


def _series_event(base: str, metric: str, promql: str, series: dict) -> Event | None:
    raw = series.get("values") or []
    values = []
    for point in raw:
        try:
            values.append((float(point[0]), float(point[1])))
        except (TypeError, ValueError, IndexError):
            continue
    values = [(t, v) for t, v in values if not math.isnan(v)]
    if not values:
        return None
    labels = {k: v for k, v in (series.get("metric") or {}).items() if k != "__name__"}
    changed = next((t for t, v in values if v != values[0][1]), values[-1][0])
    ts = datetime.fromtimestamp(changed, UTC).replace(tzinfo=None)
    label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    ev = metric_event(metric, labels, values, f"{base.rstrip('/')}/api/v1/query_range", None, "", ts)
    f = ev.fields
    name = promql.split("{")[0]
    ev.text = (f"{name}{{{label_text}}} over the window: first {f['first']:g}, last {f['last']:g}, "
               f"min {f['min']:g}, max {f['max']:g}")
    if name.endswith("_total"):  # an increase means something for a counter only, not for a gauge
        ev.text += f", increase {f['increase']:g}"
    f.pop("values", None)  # keep memory flat: the summary is what rules use
    return ev


def fetch_events(base: str, start: datetime, end: datetime) -> tuple[list[Event], list[str]]:
    """Metric events for every known engine series; problems come back as notes, never raise."""
    events: list[Event] = []
    notes: list[str] = []
    for metric, promql in QUERIES:
        try:
            result = query_range(base, promql, start, end)
        except PrometheusError as exc:
            notes.append(f"prometheus: {exc}")
            if "cannot reach" in str(exc):
                break
            continue
        for series in result:
            if isinstance(series, dict) and (ev := _series_event(base, metric, promql, series)) is not None:
                events.append(ev)
    return events, notes
