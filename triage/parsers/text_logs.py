"""Text logs of engines and hosts: vLLM, TGI, SGLang, Ollama, llama.cpp, Triton, syslog and kernel lines."""

import re
from datetime import UTC, datetime

import re2

from triage.timeparse import parse_clf, parse_glog, parse_iso, parse_md_hms, parse_slash, parse_syslog

_VLLM = re.compile(
    r"^(?:\((?P<proc>[\w.-]+)(?: rank=\d+)? pid=\d+\) )?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<md>\d\d-\d\d) "
    r"(?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)? \[?[\w./-]+:\d+\]? ?(?P<msg>.*)$")
_PROC = re.compile(r"^\((?P<proc>[\w.-]+)(?: rank=\d+)? pid=\d+\) (?P<msg>.*)$")  # (0.8-0.10: "VllmWorker rank=0")
_TGI = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT[\d:.]+Z)\s+(?P<level>INFO|WARN|ERROR|DEBUG|TRACE)\s+(?P<msg>.*)$")
_SGLANG = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?P<tag>[^\]]*)\] (?P<msg>.*)$")
_LMDEPLOY_TAG = re.compile(r" DP\d+")  # LMDeploy's stats line: "[<time> DP0] " (SGLang's: " TP0", " DP0 TP0")
_OLLAMA = re.compile(r'^time=(?P<ts>\S+) level=(?P<level>\w+) source=\S+ msg=(?P<msg>.*)$')
_GIN = re.compile(r"^\[GIN\] (?P<ts>\d{4}/\d\d/\d\d - \d\d:\d\d:\d\d) \| (?P<msg>.*)$")
_GLOG = re.compile(r"^(?P<stamp>[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+)\s+\d+ [\w.]+:\d+\] (?P<msg>.*)$")
_SYSLOG = re.compile(r"^(?P<ts>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d) \S+ [\w./-]+(?:\[\d+\])?: (?P<msg>.*)$")
_DMESG = re.compile(r"^\[\s*\d+\.\d+\] (?P<msg>.*)$")
_ISO_LEAD = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d[.,\d]*(?:Z|[+-]\d\d:?\d\d)?)[\s|,-]+(?P<msg>.*)$")
# Go's log package and zap's console encoder (Caddy run in a terminal): "2024/03/12 10:15:02.118\tWARN\t..."
_SLASH_LEAD = re.compile(r"^(?P<ts>\d{4}/\d\d/\d\d \d\d:\d\d:\d\d)(?:\.\d+)?\s+(?P<msg>.*)$")
# logrus's text format (Traefik 2.x, Docker and other Go programs): time="2023-06-01T10:05:12Z" level=debug msg="..."
_LOGRUS = re.compile(r'^time="?(?P<ts>[^" ]+)"? level=\w+ msg=(?P<msg>.*)$')
# Apache httpd's error log, 2.4 ("[Wed Mar 13 10:15:02.123456 2024] [proxy_http:error] [pid 9:tid 1] ...") and 2.2
# ("[Wed Mar 13 10:15:02 2024] [error] [client 1.2.3.4] ...")
_APACHE = re.compile(r"^\[(?P<ts>[A-Z][a-z]{2} (?P<mon>[A-Z][a-z]{2}) (?P<day>[ \d]\d) (?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)? "
                     r"(?P<year>\d{4}))\] \[[\w-]*:?\w+\] (?:\[pid [^\]]*\] )?(?P<msg>.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# What a log collector puts before the line a program wrote: docker compose's "<service>-1  | ", kubectl
# logs --timestamps' RFC3339 stamp and journald's / syslog's "Mon DD HH:MM:SS host unit[pid]: ". A stamp or
# a syslog head is taken off only when a line start some parser knows follows it (a TGI line is a stamp
# and its level, an nginx access line an address): other text keeps the envelope split_envelope reads.
_COMPOSE = re.compile(r"^[a-z0-9][a-z0-9_.-]*\s+\| ?")  # (compose names are lower case)
# (and the CRI log files under /var/log/pods: "<RFC3339> stdout F ", a partial line's "P" included)
_RFC3339 = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) (?:std(?:out|err) [FP] )?(?=\S)")
# a stamp and a tab before the line: Grafana's and Loki's copied or exported log lines
_TAB_STAMP = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\t")
# syslog as RFC 5424 writes it (rsyslog, syslog-ng forwarding): "<PRI>1 TIMESTAMP HOST APP PROCID MSGID SD "
_RFC5424 = re.compile(r"^<\d{1,3}>1 (?P<ts>\S+) \S+ \S+ \S+ \S+ (?:-|(?:\[[^\]]*\])+) ")
# podman-compose's "[<service>] | "
_PODMAN_COMPOSE = re.compile(r"^\[[\w.-]+\] +\| ?")
# a line indented (a code block inside a Markdown list) or quoted ("> ") where it was pasted
_INDENT = re.compile(r"^[ \t]*(?:>[ \t]*)*")
# journalctl's short (syslog), short-precise (fractions) and short-iso heads: "<time> <host> <unit>[pid]: "
_JOURNAL = re.compile(r"^(?P<ts>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?"
                      r"(?:Z|[+-]\d\d:?\d\d)) (?P<host>\S+) (?P<unit>[\w./@-]+)(?P<pid>\[\d+\])?: ")
_LEVELS = {"TRACE", "DEBUG", "INFO", "WARN", "WARNING", "ERROR", "CRITICAL"}  # (a TGI line: "<ts> ERROR target: ")
# PyTorch distributed's per-rank prefix on a worker's output ("[rank0]: Traceback ...", "[rank0]:[W1201 ...")
_RANK = re.compile(r"^\[rank\d+\]: ?")
# kubectl logs --prefix: "[pod/<pod>/<container>] "
_KUBECTL_PREFIX = re.compile(r"^\[pod/[\w.-]+/[\w.-]+\] ")
_KNOWN_START = re.compile(r"[{(\[]|\d|time=|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)(?: \d\d-\d\d |: +)|[IWEF]\d{4} ")  # (": +": uvicorn's)


def unwrap(line: str) -> tuple | None:
    """(ts or None, the line inside) of a line in a collector's envelope; None: no envelope.

    >>> unwrap("vllm-1  | INFO 05-09 00:49:33 api_server.py:1] hi")
    (None, 'INFO 05-09 00:49:33 api_server.py:1] hi')
    """
    if "\x1b" in line[:64]:  # docker compose colours its service names
        line = _ANSI.sub("", line)
    head = line[:1]
    if head in " \t>":
        inner = line[_INDENT.match(line).end():]
        if not _KNOWN_START.match(inner):
            return None  # (a traceback's frames and other indented text: read as they are)
        return unwrap(inner) or (None, inner)
    if head.isdigit() and (m := _RFC3339.match(line) or _TAB_STAMP.match(line)) and _KNOWN_START.match(line, m.end()):
        return parse_iso(m.group("ts").replace(" ", "T").replace(",", ".")), line[m.end():]
    if head == "<" and (m := _RFC5424.match(line)):
        return (parse_iso(m.group("ts")), line[m.end():]) if _KNOWN_START.match(line, m.end()) else None
    if (head.isdigit() or head.isupper()) and (m := _JOURNAL.match(line)):
        ts = m.group("ts")
        if "haproxy[" in line[:m.end()]:
            return None  # (HAProxy's log format is its syslog line: gateways.parse_haproxy reads it whole)
        # other text keeps the envelope where split_envelope reads it (the plain syslog head), and a TGI
        # line its level; the short-iso and short-precise heads of a unit with its pid (or the kernel's)
        # are taken off whatever follows them
        if not _KNOWN_START.match(line, m.end()) and (
                (head.isupper() and "." not in ts) or m.group("host") in _LEVELS
                or not (m.group("pid") or m.group("unit") == "kernel")):
            return None
        return parse_iso(ts) if head.isdigit() else parse_syslog(ts), line[m.end():]
    if head == "[":
        m = _RANK.match(line) or _KUBECTL_PREFIX.match(line) or _PODMAN_COMPOSE.match(line)
        if m is None:
            return None
        inner = line[m.end():]
        if m.re is not _RANK and (wrapped := unwrap(inner)) is not None:
            return wrapped  # (with --timestamps too: the prefix, then the stamp)
        return None, inner
    if not head.isalnum():
        return None
    m = _COMPOSE.match(line)
    return (None, line[m.end():]) if m else None


def split_envelope(line: str) -> tuple:
    """(ts, message, source) of a text line; unknown shapes give (None, line, "text")."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    head = line[:1]
    if head in "DIWEC(" and (m := _VLLM.match(line)):
        return parse_md_hms(m.group("md"), m.group("hms")), m.group("msg"), "vllm"
    if head == "(" and (m := _PROC.match(line)):
        return None, m.group("msg"), "vllm"
    if head.isdigit():
        if m := _TGI.match(line):
            return parse_iso(m.group("ts")), m.group("msg"), "tgi"
        if m := _ISO_LEAD.match(line):  # (LMDeploy's logger: "<time>,<ms> - lmdeploy - INFO - <file>:<line> - ")
            return parse_iso(m.group("ts")), m.group("msg"), "lmdeploy" if m.group("msg").startswith("lmdeploy - ") else "text"
        if line[4:5] == "/" and (m := _SLASH_LEAD.match(line)):
            return parse_slash(m.group("ts")), m.group("msg"), "text"
    if head == "[":
        if m := _SGLANG.match(line):
            return parse_iso(m.group("ts")), m.group("msg"), "lmdeploy" if _LMDEPLOY_TAG.fullmatch(m.group("tag")) else "sglang"
        if m := _GIN.match(line):
            return parse_slash(m.group("ts").replace(" - ", " ")), m.group("msg"), "ollama"
        if m := _DMESG.match(line):
            return None, m.group("msg"), "kernel"
        if m := _APACHE.match(line):
            ts = parse_clf(f"{m.group('day').strip():0>2}/{m.group('mon')}/{m.group('year')}:{m.group('hms')} +0000")
            return ts, m.group("msg"), "text"
    if head == "t" and (m := _OLLAMA.match(line)):
        return parse_iso(m.group("ts")), m.group("msg").strip('"'), "ollama"
    if head == "t" and (m := _LOGRUS.match(line)):
        return parse_iso(m.group("ts")), m.group("msg").strip('"'), "text"
    if head in "IWEF" and (m := _GLOG.match(line)):
        return parse_glog(m.group("stamp")), m.group("msg"), "triton"
    if head.isupper() and (m := _SYSLOG.match(line)):
        return parse_syslog(m.group("ts")), m.group("msg"), "syslog"
    return None, line, "text"


_STATS_FIELDS = (
    ("running", re.compile(r"Running: (\d+) reqs"), int),
    ("waiting", re.compile(r"(?:Waiting|Pending): (\d+) reqs"), int),
    ("kv_usage", re.compile(r"(?:GPU|CPU|XPU|TPU)? ?KV cache usage: (\d+(?:\.\d+)?)%"), lambda v: float(v) / 100),
    ("prefix_hit_rate", re.compile(r"Prefix cache hit rate: (?:GPU: )?(\d+(?:\.\d+)?)%"), lambda v: float(v) / 100),
    ("preemptions", re.compile(r"Preemptions: (\d+)"), int),
)
_SGL_STATS = (
    ("running", re.compile(r"#running-req: (\d+)"), int),
    ("waiting", re.compile(r"#queue-req: (\d+)"), int),
    ("kv_usage", re.compile(r"token usage: (\d+(?:\.\d+)?)"), float),
    ("prefix_hit_tokens", re.compile(r"#cached-token: (\d+)"), int),
    ("new_tokens", re.compile(r"#new-token: (\d+)"), int),
)
# LMDeploy 0.12.1+ (metrics/loggers.py): "Avg thr (in/out): 9541.6 / 402.3 tokens/s, API server
# (completed/routed/waiting): 17 / 31 / 0, Engine (running/waiting): 14 / 0, KV cache: 11.2%, " and "Prefix cache
# hit rate: 35.0%, " only where it is not 0 (0.16: "Server (succeeded/failed/routed/waiting): ..."); before
# 0.12.1 it wrote vLLM's words ("Avg prompt throughput: ...")
LMDEPLOY_STATS_WORDS = "Avg thr (in/out)"
_LMDEPLOY_STATS = (
    ("running", re.compile(r"Engine \(running/waiting\): (\d+) / \d+"), int),
    ("waiting", re.compile(r"Engine \(running/waiting\): \d+ / (\d+)"), int),
    ("kv_usage", re.compile(r"KV cache: (\d+(?:\.\d+)?)%"), lambda v: float(v) / 100),
    ("prefix_hit_rate", re.compile(r"Prefix cache hit rate: (\d+(?:\.\d+)?)%"), lambda v: float(v) / 100),
)
# vLLM V0 (0.4-0.7) logs its hit rate on a line of its own after each stats line:
# "Prefix cache hit rate: GPU: 62.35%, CPU: 0.00%"
_V0_HIT_RATE = "Prefix cache hit rate: GPU: "
# Checked in this order: "Loading weights took" is a finished load, not a starting one.
_PHASES = (
    # the engine never finished starting (TGI's launcher, vLLM V1's engine core): an OOM just before it
    # happened at start-up
    ("phase.start_failed", ("failed to start", "ShardCannotStart", "Engine core initialization failed")),
    ("phase.weights_loaded", ("Model loading took", "weights took", "model weights loaded", "successfully loaded '",
                              "Load weight end")),  # (SGLang: "Load weight end. type=...")
    ("phase.kv_setup", ("Available KV cache memory", "GPU KV cache size", "# GPU blocks", "# cuda blocks",
                        "Maximum concurrency for", "Warming up model", "Capturing CUDA graph",
                        "llama_kv_cache", "KV self size", "Memory profiling takes",
                        "llama_context: constructing llama_context", "llama_new_context_with_model: n_ctx",
                        "KV Cache is allocated", "Capture cuda graph begin",  # (the last two: SGLang)
                        "llama_context: n_ctx ", "Building CacheEngine")),  # (llama.cpp 2025+; LMDeploy PyTorch)
    ("phase.serving", ("Application startup complete", "Uvicorn running on", "server is listening on",
                       "llama runner started", "llama-server started in", "Server started", "Started GRPCInferenceService",
                       "Started HTTPService", "fired up and ready to roll",
                       "main: listening on")),  # (llama-server 2026: "srv          main: listening on http://...";
    # Ollama May 2026+, which runs llama-server: "llama-server started in 4.01 seconds")
    # Triton's "failed to load 'm' version 1: <error>" names the load phase in the failing line itself
    ("phase.weights_loading", ("Starting to load model", "Loading safetensors checkpoint", "Loading weights",
                               "llm_load_tensors", "load_tensors:", "Loading model weights", "failed to load '",
                               "Load weight begin", "Building Model.",  # (SGLang; LMDeploy PyTorch)
                               # Ollama: "waiting for llama runner to start responding" (2024-2026: "llama-server")
                               "to start responding")),
)
# "Received request <id>: prompt: '<prompt>', params": the prompt runs to the first closing quote before
# ", params" (found by str.find, not by a lazy regex that tries every character of a long prompt)
_RECEIVED_HEAD = re.compile(r"Received request (?P<id>[^\s:]+):? prompt: (?P<q>['\"])")
# vLLM 0.11+ logs the prompt at DEBUG only (--enable-log-requests --log-level DEBUG), in its own line:
# "Request <id> details: prompt: '<prompt>', prompt_token_ids: [...], prompt_embeds shape: None."
_DETAILS_HEAD = re.compile(r"Request (?P<id>\S+) details: prompt: (?P<q>['\"])")
# The words of a logged prompt's line, one of which each holds (vLLM's "Received request <id>: prompt: '...'",
# TGI's and later vLLM's "Request <id> details: prompt: '...'"): what follows them is user text
# SGLang's --log-requests (managers/tokenizer_manager.py 0.4, utils/request_logger.py 0.5): "Receive:
# obj=GenerateReqInput(text='<prompt>', input_ids=None, ...rid='<id>'...)", its text first (a long one cut to
# "'<head>' ... '<tail>'")
_SGLANG_RECEIVE_HEAD = re.compile(r"Receive: obj=GenerateReqInput\((?P<id>)text=(?P<q>['\"])")
_SGLANG_RID = re.compile(r", rid='(?P<id>[^'\s]+)'")
LOGGED_PROMPT_WORDS = ("Received request", " details: prompt: ", "Receive: obj=GenerateReqInput(")
PHASE_WORDS = tuple(k for _, keys in _PHASES for k in keys)
_ANY_PHASE = re2.compile("|".join(map(re.escape, PHASE_WORDS)))
# A container's last run as the platforms print it: kubectl describe's "Started:" and "Finished:" under
# "Last State: Terminated" (RFC 1123 with its zone: kubectl pkg/describe describeContainerState), kubectl
# get -o yaml's startedAt and finishedAt, and the JSON of kubectl get -o json and docker inspect
# ("StartedAt", "FinishedAt"). triage.parsers.FileParser pairs a start with the finish beside it.
CONTAINER_TIME_WORDS = ("Started:", "Finished:", "startedAt", "finishedAt", "StartedAt", "FinishedAt")
_CONTAINER_TIME = re.compile(
    r'^\s*(?:(?P<word>Started|Finished):\s+(?P<rfc>\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d [+-]\d{4})'
    r'|"?(?P<key>[sS]tartedAt|[fF]inishedAt)"?:\s*"?(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?'
    r'(?:Z|[+-]\d\d:?\d\d))"?,?)\s*$')


def container_time(msg: str) -> tuple[str, datetime] | None:
    """("started" or "finished", the time in UTC) of a line that gives a container's start or finish
    time, else None; also None for the zero time a platform prints for a time it never had."""
    m = _CONTAINER_TIME.match(msg)
    if m is None:
        return None
    if m.group("rfc"):
        try:
            at = datetime.strptime(m.group("rfc"), "%a, %d %b %Y %H:%M:%S %z").astimezone(UTC).replace(tzinfo=None)
        except ValueError:
            return None
        which = m.group("word")
    else:
        at, which = parse_iso(m.group("iso")), m.group("key")
    if at is None or at.year < 1971:  # (Go's zero time: 0001-01-01)
        return None
    return ("started" if which[0] in "sS" else "finished"), at


# llama-server's slot reuse (examples/server/server.cpp, b4000-b5000): with -v, how much of a slot's cached
# prompt the new one holds as a subsequence ("selected slot by lcs similarity, lcs_len = 3934, similarity =
# 0.972078", lcs_len over the cached tokens), then how much of it is a common prefix, kept ("kv cache rm [17,
# end)": the rest is computed again)
SLOT_SELECTED_WORDS = "selected slot by lcs similarity"
SLOT_KEPT_WORDS = "kv cache rm ["
_SLOT_SELECTED = re.compile(r"\bid +(?P<slot>\d+) \| task -?\d+ \| selected slot by lcs similarity, "
                            r"lcs_len = (?P<lcs>\d+), similarity = (?P<similarity>\d+(?:\.\d+)?)")
_SLOT_KEPT = re.compile(r"\bid +(?P<slot>\d+) \| task -?\d+ \| kv cache rm \[(?P<kept>\d+), end\)")


def slot_events(msg: str) -> list[tuple[str, dict]]:
    """llama-server's slot selection by similarity and the prefix it then kept, as events."""
    if SLOT_SELECTED_WORDS in msg and (m := _SLOT_SELECTED.search(msg)):
        return [("cache.slot_selected", {"slot": int(m.group("slot")), "lcs_len": int(m.group("lcs")),
                                         "similarity": float(m.group("similarity"))})]
    if SLOT_KEPT_WORDS in msg and (m := _SLOT_KEPT.search(msg)):
        return [("cache.slot_kept", {"slot": int(m.group("slot")), "kept": int(m.group("kept"))})]
    return []


# vLLM production-stack's router (services/request_service/request.py, vllm-stack 0.1.5 to 2026): "Routing
# request <id> with session id <id or None> to <url> at <time>, process time = <s>": which replica a
# request went to, by the session (None: no session header, the routing logic alone chose)
ROUTED_WORDS = "Routing request "
_ROUTED = re.compile(r"Routing request (?P<id>\S+) with session id (?P<session>\S+) to (?:https?://)?(?P<upstream>[^/\s]+)")


def routed(msg: str) -> dict | None:
    """A router's choice of replica for a request, or None."""
    m = _ROUTED.search(msg)
    if m is None:
        return None
    session = m.group("session")
    return {"request_id": m.group("id"), "client": None if session == "None" else session,
            "upstream_addr": m.group("upstream")}


# triage.parsers.MAKES: the kinds engine_text_events makes, by the words it checks first
MAKES = (
    ("request.routed", None, (ROUTED_WORDS,), ()),
    ("cache.slot_selected", None, (SLOT_SELECTED_WORDS,), ()),
    ("cache.slot_kept", None, (SLOT_KEPT_WORDS,), ()),
    ("container.ran", None, CONTAINER_TIME_WORDS, ()),
    ("engine.stats", None, ("Avg prompt throughput", "#running-req", _V0_HIT_RATE, LMDEPLOY_STATS_WORDS), ()),
    ("request.received", None, LOGGED_PROMPT_WORDS, ()),
    ("request.aborted", None, ("borted",), ()),
    *((kind, None, keys, ()) for kind, keys in _PHASES),
)
_ABORTED = re.compile(r"Aborted request(?:\(s\)|s)? (?P<ids>[^\s.][^ ]*?)\.?$|Request (?P<id>\S+) aborted\.")
# vLLM 0.11+ (InputProcessor.assign_request_id) runs a request under "<its id>-<8 hex of random_uuid()>"
# and logs that internal id in "Added request" and "Aborted request(s)", the id it was given in "Received
# request" and "Request <id> aborted.": one abort is logged under both, so the suffix is dropped.
_VLLM_INTERNAL_SUFFIX = re.compile(r"^(?P<id>[^\s]+-[^\s-]+)-[0-9a-f]{8}$")


def external_request_id(request_id: str) -> str:
    """The id a vLLM request was given, from its internal "<id>-<8 hex>" (any other id unchanged)."""
    m = _VLLM_INTERNAL_SUFFIX.match(request_id)
    return m.group("id") if m else request_id


def _stats(msg: str, table) -> dict:
    out = {}
    for key, pattern, conv in table:
        m = pattern.search(msg)
        if m:
            out[key] = conv(m.group(1))
    return out


def vllm_stats(msg: str) -> dict:
    """The fields of vLLM's stats line ("Avg prompt throughput: ..."), those it has."""
    return _stats(msg, _STATS_FIELDS)


def engine_text_events(msg: str, phase: bool = True) -> list[tuple[str, dict]]:
    """Engine semantics of a text message: stats lines, start-up phases, request lifecycle. phase False:
    the line is known to hold no phase marker word (its block was scanned for them)."""
    # a logged prompt is user text: a stats line's words or a phase word in it are the user's, not the engine's
    if "Received request" in msg and (received := _received(msg)):
        return [("request.received", received)]
    if " details: prompt: " in msg and (received := _received(msg, _DETAILS_HEAD, ", prompt_token_ids")):
        return [("request.received", received)]
    if "Receive: obj=GenerateReqInput(" in msg and (received := _received(msg, _SGLANG_RECEIVE_HEAD, ", input_ids=")):
        rid = _SGLANG_RID.search(msg, msg.find(", input_ids="))
        received["request_id"] = rid.group("id") if rid else None
        return [("request.received", received)]
    out: list[tuple[str, dict]] = []
    if "Avg prompt throughput" in msg:
        out.append(("engine.stats", vllm_stats(msg)))
    elif msg.startswith(_V0_HIT_RATE):
        out.append(("engine.stats", vllm_stats(msg)))
    elif LMDEPLOY_STATS_WORDS in msg:
        out.append(("engine.stats", _stats(msg, _LMDEPLOY_STATS)))
    elif "slot " in msg and (slot := slot_events(msg)):
        out.extend(slot)
    elif ROUTED_WORDS in msg and (route := routed(msg)):
        out.append(("request.routed", route))
    elif "batch" in msg and "#running-req" in msg:
        fields = _stats(msg, _SGL_STATS)
        if "new_tokens" in fields and "prefix_hit_tokens" in fields:
            fields["prefix_queried_tokens"] = fields["new_tokens"] + fields["prefix_hit_tokens"]
        out.append(("engine.stats", fields))
    elif "borted" in msg and (m := _ABORTED.search(msg)):
        if m.group("ids"):  # vLLM's engine side: internal ids
            ids = [external_request_id(i) for i in m.group("ids").split(",") if i]
        else:
            ids = [m.group("id")]
        out.append(("request.aborted", {"request_ids": ids, "reason": None}))
    if phase and _ANY_PHASE.search(msg):  # one search for every marker word; the first kind that has one wins
        for kind, keys in _PHASES:
            if any(k in msg for k in keys):
                out.append((kind, {}))
                break
    return out


def _received(msg: str, head: re.Pattern = _RECEIVED_HEAD, after: str = ", params") -> dict | None:
    m = head.search(msg)
    while m is not None:
        end = msg.find(m.group("q") + after, m.end())
        if end >= 0:
            return {"request_id": m.group("id"), "prompt": msg[m.end():end]}
        m = head.search(msg, m.start() + 1)
    return None
