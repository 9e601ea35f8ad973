"""Finding builders and wording for the stream-cut family (kept apart from the signal bookkeeping)."""

from triage.model import Confidence, Finding

BUFFER_MIN_GAP_S = 0.25  # client TTFT this much above the engine's, and
BUFFER_MIN_RATIO = 3.0  # this many times it, means something between them held the tokens back
RARE_DISCONNECT_SHARE = 0.01  # disconnects under this share of 100 requests or more: no finding
FEW_DISCONNECTS = 2  # this many disconnects or fewer, among at least FEW_AMONG times as many requests served: a
FEW_AMONG = 8  # user who left (a hint), not an incident

STEPS_CRASH = [
    "read the engine log just before the first connection refused: the fatal error and its traceback",
    "curl -s http://<engine>/ready ; systemctl status / kubectl describe pod (exit code, restarts)",
    "if the fatal error is an OOM or a CUDA error, follow that finding first; then restart the engine",
    "nginx: proxy_next_upstream error timeout; several replicas so one crash does not drop traffic",
]
STEPS_TIMEOUT = [
    "raise proxy_read_timeout (nginx; ingress annotation nginx.ingress.kubernetes.io/proxy-read-timeout) above "
    "the longest gap between tokens, including queueing before the first one",
    "Envoy: route timeout: 0s and a stream_idle_timeout; ALB: raise the idle timeout",
    "shorten TTFT: queueing before the first token is the usual long gap (see queue-backlog)",
    "grep 'upstream timed out' /var/log/nginx/error.log | wc -l",
]
STEP_CLOUDFLARE = (
    "behind Cloudflare: the origin must send its response headers within Cloudflare's proxy read timeout (100 s; "
    "only Enterprise plans raise it): stream (stream=true) so the headers go out at once, or send long jobs "
    "through a hostname Cloudflare does not proxy")
# The timeout to raise behind other gateways than nginx, by the catalog entry (its id's first word) or the
# access log (its source) that showed the cut
GATEWAY_TIMEOUT_STEPS = {
    "traefik": "Traefik: raise serversTransport forwardingTimeouts.responseHeaderTimeout (0, none, by default) or "
               "remove it for the engine's service; stream so the headers go out at once",
    "caddy": "Caddy: raise (or remove) reverse_proxy transport http response_header_timeout / read_timeout",
    "go": "the proxy's response-header timeout (Traefik forwardingTimeouts.responseHeaderTimeout, Caddy "
          "response_header_timeout): raise it above the longest time to the first token",
    "apache": "Apache httpd: raise ProxyTimeout (or timeout= on the ProxyPass line; Timeout, 60 s, by default)",
    "litellm": "LiteLLM: raise timeout / stream_timeout (per model in model_list, or litellm_settings "
               "request_timeout) above the longest generation",
    "kong": "Kong: raise the service's read_timeout (60000 ms by default)",
}
STEPS_CLIENT = [
    "check the client's own timeout (openai timeout=, httpx.Timeout(read=...)) against the longest answers",
    "count 499s: awk '$9 == 499' access.log | wc -l, and their $request_time spread",
    "if users cancel on purpose (stop button), this is expected; if not, stream earlier or cap max_tokens",
]
STEPS_BUFFERING = [
    "nginx: proxy_buffering off; (and proxy_cache off;) in the location that proxies /v1/",
    "or have the server send X-Accel-Buffering: no on SSE responses",
    "compare client TTFT (loadgen report) with llm_time_to_first_token_seconds after the change",
]


def crash_finding(rule, confidence: Confidence | None = None) -> Finding:
    c = rule.crash
    for ev in rule.stream_cuts:
        c.add(ev, ev.kind, False)
    return c.finding(
        "The engine crashed or stopped answering",
        "The engine died (a fatal error, or its process went away); the gateway then found nothing listening "
        "(connection refused, 502) or saw upstream connections close mid-stream. Cut streams and 502s "
        "here are symptoms of the crash.", STEPS_CRASH, confidence)


def _timeout_time(rule) -> tuple[float, int] | None:
    """(time, number of requests) at the gateway's timeout, when 3 or more requests ended there. The
    requests it cut (504s) lasted the timeout: their commonest time is it. Without them, the longest
    times seen are, as a timeout caps request times (never a common time of healthy requests below)."""
    counts = rule.timeout_durations
    if rule.timeout_cut_durations:
        value = rule.timeout_cut_durations.most_common(1)[0][0]
    elif counts:
        top = max(counts)
        value = max((v for v in counts if v >= top - 0.5), key=counts.__getitem__)
    else:
        return None
    total = sum(count for v, count in counts.items() if abs(v - value) <= 0.5)
    return (value, total) if total >= 3 else None


def timeout_finding(rule) -> Finding:
    t = rule.timeout
    confidence = None
    if not t:
        for ev in rule.stream_cuts:
            t.add(ev, ev.kind, False)
        t.counter.append("a cut stream alone does not say who cut it: no gateway or engine log was seen")
        confidence = Confidence.LOW
    else:
        t.merge(rule.aborts)
        for ev in rule.abort_metrics:
            t.add(ev, "metric.finished_abort", False)
        for ev in rule.stream_cuts:
            t.add(ev, ev.kind, False)
    detail = " The engine saw its client go away." if rule.aborts else ""
    at = _timeout_time(rule)
    if at is not None:
        detail += f" {at[1]} requests lasted {at[0]:.1f} s at the gateway: the configured timeout."
    steps = STEPS_TIMEOUT
    shown = {sid.partition("-")[0] for sid in t.signature_ids} | {g.signal.partition(".")[0]
                                                                  for g in t.evidence.groups.values()}
    extra = [step for name, step in GATEWAY_TIMEOUT_STEPS.items() if name in shown]
    if extra:
        steps = [*extra, *STEPS_TIMEOUT]
    if any(s.startswith("cloudflare") for s in t.signature_ids) or any(
            g.signal == "cloudflare.timeout" for g in t.evidence.groups.values()):
        detail += (" Cloudflare answers 524 when the origin has sent no response within its proxy read "
                   "timeout (100 s).")
        steps = [STEP_CLOUDFLARE, *steps]
    return t.finding(
        "Streams cut by a gateway timeout",
        "The gateway gave up on the upstream after its read timeout (nginx proxy_read_timeout, 60 s by "
        "default) passed with no byte from the engine: a 504 before the headers, or a 200 cut short "
        "mid-stream." + detail, steps, confidence)


def client_finding(rule, facts) -> Finding | None:
    c = rule.client
    if rule.in_shutdown_tail(facts):
        return None
    if facts.num_requests >= 100 and c.num_decisive < RARE_DISCONNECT_SHARE * facts.num_requests:
        return None  # a tab closed now and then in a busy log is not an incident
    if not c.num_decisive:
        # hints alone (a catalog entry of medium confidence) or engine aborts: medium, when nothing decided
        if rule.timeout.num_decisive or rule.crash.num_decisive or not (rule.aborts or c.num_corroborating):
            return None
    c.merge(rule.aborts)
    for ev in rule.abort_metrics:
        c.add(ev, "metric.finished_abort", False)
    durations = rule.client_durations
    if len(durations) >= 3:
        low, high = min(durations), max(durations)
        if high > 0 and (high - low) / high < 0.02:
            c.counter.append(f"disconnect times cluster at {high:.1f} s: a fixed timeout somewhere (the client's own?)")
    if rule.timeout.num_decisive:
        c.counter.append("gateway timeouts were also seen: some of these aborts may be the gateway's")
    spread = f" Durations ranged {min(durations):.1f}-{max(durations):.1f} s." if len(durations) >= 2 else ""
    confidence = None
    n = facts.num_requests
    cuts = _most_in_one_file(c)  # (the gateway's 499 and the engine's abort of one request: one disconnect)
    if 0 < cuts <= FEW_DISCONNECTS and n >= FEW_AMONG * cuts:
        c.counter.append(f"{cuts} disconnect(s) among {n} requests, the rest served: a user who left, not an incident")
        confidence = Confidence.LOW
    return c.finding(
        "Clients disconnected before their answers finished",
        "Clients closed the connection first (nginx 499 or 'client prematurely closed connection', a client "
        "cancel or its own read timeout); the engine aborted those requests and freed their blocks. Varied "
        "durations point at people or client timeouts, not at the gateway." + spread, STEPS_CLIENT, confidence)


def _most_in_one_file(cand) -> int:
    """The most decisive lines any one file gave the candidate (each layer logs a disconnect once)."""
    by_file: dict[str, int] = {}
    for group in cand.evidence.groups.values():
        if group.decisive:
            by_file[group.file] = by_file.get(group.file, 0) + group.count
    return max(by_file.values(), default=0)


def _buffering_decisive(rule) -> str | None:
    """Client TTFT far above the engine's: the evidence rows, the affected requests and the detail text."""
    from triage.rules.streams import median

    b = rule.buffering
    client, server = median(rule.client_ttft), median(rule.server_ttft)
    if client is None or server is None:
        return None
    if client - server < BUFFER_MIN_GAP_S or client < BUFFER_MIN_RATIO * max(server, 1e-3):
        b.counter.append(f"client TTFT (median {client * 1000:.0f} ms) is close to the engine's "
                         f"({server * 1000:.0f} ms)")
        return None
    limit = max(BUFFER_MIN_RATIO * server, server + BUFFER_MIN_GAP_S)
    for ev in rule.client_samples:
        b.add(ev, "client.ttft_far_above_engine", True)
    for ev in rule.server_samples:
        b.add(ev, "engine.ttft", False)
    for ttft, rid in zip(rule.client_ttft, rule.client_ttft_ids, strict=True):
        if ttft >= limit:
            b.requests.add(rid)
    return (f" Median client TTFT {client * 1000:.0f} ms vs engine TTFT {server * 1000:.0f} ms "
            f"({len(rule.client_ttft)} client and {len(rule.server_ttft)} engine samples).")


def buffering_finding(rule) -> Finding | None:
    b = rule.buffering
    detail = _buffering_decisive(rule)
    config = any(g.signal.startswith("config") for g in b.evidence.groups.values())
    if detail is None and not config:
        return None
    detail = detail or ""
    if rule.num_bursty:
        detail += f" {rule.num_bursty} requests received their tokens in bursts (gaps under 2 ms)."
    if rule.num_errors or rule.crash or rule.timeout:
        b.counter.append("errors or cut streams were also seen: buffering alone causes no errors")
    return b.finding(
        "Tokens held back by a buffering proxy",
        "The engine produced its first token quickly but clients received it much later, with tokens "
        "arriving in bursts and no error anywhere: a proxy between them buffers the SSE response "
        "(nginx proxy_buffering on, its default)." + detail, STEPS_BUFFERING)
