"""The three boards as data: engine overview, GPUs, TTFT SLO. Queries read llm:* series and up only."""

from __future__ import annotations

from dashboards.grafana import Board, Panel, Query, Variable

ENGINE = '{instance=~"$instance", model=~"$model"}'
GPU = '{instance=~"$instance", gpu=~"$gpu"}'
SLO_BUDGET = 0.01  # 1 - 0.99: the TTFT objective of alerts/alerts.rules.yml (99% under 2 s)
QUANTILES = ("0.5", "0.9", "0.99")


def _engine_vars() -> list[Variable]:
    return [Variable("instance", "Instance", "label_values(llm:requests_running, instance)"),
            Variable("model", "Model", 'label_values(llm:requests_running{instance=~"$instance"}, model)')]


def _sel(extra: str) -> str:
    """The engine selector with more matchers: _sel('quantile="0.9"')."""
    return ENGINE[:-1] + ", " + extra + "}"


def _quantiles(title: str, series: str, description: str) -> Panel:
    queries = [Query(f'{series}{_sel(f"quantile={chr(34)}{q}{chr(34)}")}', f"p{float(q) * 100:g} {{{{instance}}}}")
               for q in QUANTILES]
    return Panel(title, queries, unit="s", description=description)


def engine_overview() -> Board:
    at_a_glance = [
        Panel("Requests/s", [Query(f"sum(llm:requests:rate5m{ENGINE})")], unit="reqps", kind="stat", width=4, height=4),
        Panel("Running", [Query(f"sum(llm:requests_running{ENGINE})")], kind="stat", width=4, height=4),
        Panel("Waiting", [Query(f"sum(llm:requests_waiting{ENGINE})")], kind="stat", width=4, height=4,
              thresholds=[(1, "orange"), (10, "red")]),
        Panel("KV cache usage (max)", [Query(f"max(llm:kv_cache_usage:ratio{ENGINE})")], unit="percentunit",
              kind="stat", width=4, height=4, thresholds=[(0.9, "orange"), (0.98, "red")], max_value=1),
        Panel("Prefix cache hit rate", [Query(f"avg(llm:prefix_cache_hit:ratio_rate5m{ENGINE})")],
              unit="percentunit", kind="stat", width=4, height=4, max_value=1),
        Panel("Engines down", [Query('count(up{job="llm-engine", instance=~"$instance"} == 0) or vector(0)')],
              kind="stat", width=4, height=4, thresholds=[(1, "red")]),
    ]
    traffic = [
        Panel("Requests by finish reason", [Query(f"sum by (finish_reason) (llm:requests_finished:rate5m{ENGINE})",
                                                  "{{finish_reason}}")], unit="reqps"),
        Panel("Tokens/s", [Query(f"sum by (instance) (llm:prompt_tokens:rate5m{ENGINE})", "prompt {{instance}}"),
                           Query(f"sum by (instance) (llm:generation_tokens:rate5m{ENGINE})",
                                 "generation {{instance}}")], unit="short"),
        Panel("Running and waiting", [Query(f"llm:requests_running{ENGINE}", "running {{instance}}"),
                                      Query(f"llm:requests_waiting{ENGINE}", "waiting {{instance}}")]),
        Panel("Errors, aborts and rejections", [
            Query(f"llm:requests_error:ratio_rate5m{ENGINE}", "error {{instance}}"),
            Query(f"llm:requests_abort:ratio_rate5m{ENGINE}", "abort {{instance}}"),
            Query(f"llm:requests_rejected:ratio_rate5m{ENGINE}", "rejected {{reason}} {{instance}}")],
            unit="percentunit", thresholds=[(0.05, "orange"), (0.1, "red")]),
        Panel("HTTP responses by status", [Query(f"sum by (status) (llm:http_requests:rate5m{ENGINE})", "{{status}}")],
              unit="reqps", description="llmserve only (vLLM and SGLang do not export it in this form)."),
        Panel("Engine ready", [Query(f"llm:engine_ready{ENGINE}", "{{instance}}")], kind="state-timeline",
              description="1 ready, 0 not ready (llmserve only).", thresholds=[(1, "green")],
              base_color="red"),
    ]
    latency = [
        _quantiles("Time to first token", "llm:ttft_seconds:quantile_rate5m", "Queue + prefill, per request."),
        _quantiles("Inter-token latency", "llm:itl_seconds:quantile_rate5m", "Gap between streamed tokens."),
        _quantiles("Time per output token", "llm:tpot_seconds:quantile_rate5m",
                   "Per request: decode time over output tokens after the first."),
        _quantiles("End-to-end latency", "llm:e2e_seconds:quantile_rate5m", "Arrival to last token."),
        _quantiles("Queue time", "llm:queue_time_seconds:quantile_rate5m", "Arrival to first scheduling."),
    ]
    cache = [
        Panel("KV cache usage", [Query(f"llm:kv_cache_usage:ratio{ENGINE}", "{{instance}}")], unit="percentunit",
              thresholds=[(0.9, "red")], max_value=1),
        Panel("Preemptions/s", [Query(f"llm:preemptions:rate5m{ENGINE}", "{{instance}}")], unit="short"),
        Panel("Prefix cache hit rate", [Query(f"llm:prefix_cache_hit:ratio_rate5m{ENGINE}", "5m {{instance}}"),
                                        Query(f"llm:prefix_cache_hit:ratio_avg1h{ENGINE}", "1h average {{instance}}")],
              unit="percentunit", max_value=1),
        Panel("Prefix cache lookups", [
            Query(f"llm:prefix_cache_queried_tokens:rate5m{ENGINE}", "queried {{instance}}"),
            Query(f"llm:prefix_cache_hit_tokens:rate5m{ENGINE}", "hit {{instance}}")], unit="short"),
    ]
    return Board("llmsre-engine", "llmsre / Engine overview",
                 "Traffic, latency percentiles, KV cache and prefix cache of llmserve, vLLM or SGLang.",
                 _engine_vars(), [("At a glance", at_a_glance), ("Traffic", traffic), ("Latency", latency),
                                  ("KV cache and prefix cache", cache)])


def gpu_board() -> Board:
    variables = [Variable("instance", "Instance", "label_values(llm:gpu_utilization:ratio, instance)"),
                 Variable("gpu", "GPU", 'label_values(llm:gpu_utilization:ratio{instance=~"$instance"}, gpu)')]
    legend = "GPU {{gpu}} {{instance}}"
    usage = [
        Panel("GPU utilization", [Query(f"llm:gpu_utilization:ratio{GPU}", legend)], unit="percentunit", max_value=1),
        Panel("Memory used", [Query(f"llm:gpu_memory_used:ratio{GPU}", legend)], unit="percentunit",
              thresholds=[(0.95, "red")], max_value=1),
        Panel("Memory used (bytes)", [Query(f"llm:gpu_memory_used:bytes{GPU}", legend)], unit="bytes"),
        Panel("Exporters up", [Query('up{job="llm-gpu-exporter", instance=~"$instance"}', "{{instance}}")],
              kind="state-timeline", thresholds=[(1, "green")], base_color="red"),
        Panel("NVML answering", [Query('llm:gpu_nvml_up{instance=~"$instance"}', "{{instance}}")],
              kind="state-timeline", thresholds=[(1, "green")], base_color="red",
              description="0: the exporter answers but cannot read NVML, so no GPU series (LLMGPUNVMLDown)."),
    ]
    thermals = [
        Panel("Temperature", [Query(f"llm:gpu_temperature:celsius{GPU}", legend)], unit="celsius",
              thresholds=[(85, "red")]),
        Panel("Power", [Query(f"llm:gpu_power:watts{GPU}", legend)], unit="watt"),
        Panel("SM clock", [Query(f"llm:gpu_sm_clock:hz{GPU}", legend)], unit="hertz"),
        Panel("Clock event reasons active", [Query(f"llm:gpu_throttle:active{GPU} == 1", "{{reason}} GPU {{gpu}}")],
              kind="state-timeline", description="Only active reasons are shown; thermal ones fire LLMGPUThermalThrottle."),
    ]
    health = [
        # A GPU without XIDs draws a flat 0 (xid="none"), not "No data": quiet and broken look different.
        Panel("XID events (last 10m)", [Query(
            f"llm:gpu_xid_errors:increase10m{GPU} or on (instance, gpu) "
            f'label_replace(0 * llm:gpu_memory_used:ratio{GPU}, "xid", "none", "", "")',
            "XID {{xid}} GPU {{gpu}}")], unit="short", thresholds=[(1, "red")],
            description="Events per XID code; xid=none at 0 when a GPU had none in the last 10 minutes."),
        Panel("Uncorrectable ECC errors", [Query(f"llm:gpu_ecc_uncorrected_errors:total{GPU}", legend)],
              unit="short", thresholds=[(1, "red")]),
    ]
    return Board("llmsre-gpu", "llmsre / GPUs",
                 "GPU usage, thermals and health from llm-gpu-exporter or dcgm-exporter (by instance and GPU).",
                 variables, [("Usage", usage), ("Power and thermals", thermals), ("Health", health)])


def _burn(window: str, short: str) -> list[Query]:
    return [Query(f"llm:ttft_slo_errors:ratio_rate{window}{ENGINE} / {SLO_BUDGET}", f"{window} {{{{instance}}}}"),
            Query(f"llm:ttft_slo_errors:ratio_rate{short}{ENGINE} / {SLO_BUDGET}", f"{short} {{{{instance}}}}")]


def slo_board() -> Board:
    budget = [
        Panel("TTFT under 2 s, last 30 days", [Query(f"1 - max(llm:ttft_slo_errors:ratio_rate30d{ENGINE})")],
              unit="percentunit", kind="stat", width=8, height=5, description="Objective: 99%.",
              thresholds=[(0.99, "green")]),
        Panel("Error budget left (30 days)",
              [Query(f"1 - max(llm:ttft_slo_errors:ratio_rate30d{ENGINE}) / {SLO_BUDGET}")],
              unit="percentunit", kind="stat", width=8, height=5),
        Panel("Burn rate, 1h", [Query(f"max(llm:ttft_slo_errors:ratio_rate1h{ENGINE}) / {SLO_BUDGET}")],
              kind="stat", width=8, height=5, thresholds=[(1, "orange"), (14.4, "red")]),
        Panel("Share of requests over 2 s", [
            Query(f"llm:ttft_slo_errors:ratio_rate{w}{ENGINE}", f"{w} {{{{instance}}}}") for w in ("5m", "1h", "1d")],
            unit="percentunit", width=24, thresholds=[(SLO_BUDGET, "orange")]),
    ]
    pages = [
        Panel("Page: 1h / 5m (fires above 14.4x)", _burn("1h", "5m"), thresholds=[(14.4, "red")]),
        Panel("Page: 6h / 30m (fires above 6x)", _burn("6h", "30m"), thresholds=[(6, "red")]),
    ]
    tickets = [
        Panel("Ticket: 1d / 2h (fires above 3x)", _burn("1d", "2h"), thresholds=[(3, "orange")]),
        Panel("Ticket: 3d / 6h (fires above 1x)", _burn("3d", "6h"), thresholds=[(1, "orange")]),
    ]
    return Board("llmsre-slo", "llmsre / TTFT SLO",
                 "99% of requests get their first token within 2 s: budget and multi-window burn rates "
                 "(LLMTTFTSLOBurn).", _engine_vars(),
                 [("Objective and budget", budget), ("Burn rates that page", pages),
                  ("Burn rates that open a ticket", tickets)])


def boards() -> list[Board]:
    return [engine_overview(), gpu_board(), slo_board()]
