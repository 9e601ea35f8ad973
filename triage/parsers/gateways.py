"""Gateway logs: nginx access and error, Traefik, Caddy, HAProxy, Envoy, AWS ALB, Cloudflare and uvicorn access lines."""

import json
import re
from datetime import UTC, datetime

from triage.model import Event
from triage.parsers.text_logs import LOGGED_PROMPT_WORDS
from triage.timeparse import parse_clf, parse_iso, parse_slash

_NGINX_ACCESS = re.compile(
    r'^(?P<client>\S+) \S+ \S+ \[(?P<time>[^\]]+)\] "(?P<request>[^"]*)" (?P<status>\d{3}) (?P<bytes>\d+|-)'
    r'(?: "(?P<referer>[^"]*)" "(?P<ua>[^"]*)")?(?P<tail>.*)$')
_NGINX_ERROR = re.compile(
    r"^(?P<ts>\d{4}/\d\d/\d\d \d\d:\d\d:\d\d) \[(?P<level>\w+)\] \d+#\d+: (?:\*\d+ )?(?P<msg>.*)$")
_UPSTREAM = re.compile(r'upstream: "(?:https?://)?(?P<addr>[^/"]+)')
# Nginx Proxy Manager's own log_format "proxy" (its proxy hosts' access logs), and "standard" without the
# cache and upstream statuses and Sent-to: `[$time_local] $upstream_cache_status $upstream_status $status -
# $request_method $scheme $host "$request_uri" [Client $remote_addr] [Length $body_bytes_sent] [Gzip
# $gzip_ratio] [Sent-to $server] "$http_user_agent" "$http_referer"`
_NPM = re.compile(
    r'^\[(?P<time>[^\]]+)\] (?:\S+ (?P<us>\S+(?:, \S+)*) )?(?P<status>\d{3}) - (?P<method>\S+) \S+ \S+ "(?P<uri>[^"]*)" '
    r'\[Client (?P<client>[^\]]*)\] \[Length (?P<bytes>\d+|-)\] \[Gzip [^\]]*\](?: \[Sent-to (?P<upstream>[^\]]*)\])? '
    r'"(?P<ua>[^"]*)"')
_HAPROXY = re.compile(
    r'haproxy\[\d+\]: (?P<client>\S+) \[(?P<time>[^\]]+)\] \S+ (?P<backend>\S+) (?P<timers>[-\d/+]+) '
    r'(?P<status>-?\d+) (?P<bytes>\d+) \S+ \S+ (?P<term>\S{4}) .*?"(?P<request>[^"]*)"')
# Envoy's default format; Istio's sidecar and gateway format has more fields after the flags: (1.9+)
# %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% "%UPSTREAM_TRANSPORT_FAILURE_REASON%", (1.5-1.8) two quoted ones
_ENVOY = re.compile(
    r'^\[(?P<ts>[^\]]+)\] "(?P<request>[^"]*)" (?P<status>\d+) (?P<flags>\S+) '
    r'(?:\S+ \S+ "[^"]*" |"[^"]*" "[^"]*" )?(?P<rx>\d+) (?P<tx>\d+) '
    r'(?P<duration>\d+|-) (?P<upstream_time>\S+) "[^"]*" "[^"]*" "(?P<rid>[^"]*)" "[^"]*" "(?P<upstream>[^"]*)"')
_ALB = re.compile(
    r'^(?:https?|h2|grpcs?|wss?) (?P<ts>\S+) \S+ (?P<client>\S+) (?P<target>\S+) (?P<rpt>\S+) (?P<tpt>\S+) '
    r'(?P<rspt>\S+) (?P<status>\d{3}|-) (?P<target_status>\d{3}|-) (?P<rx>\d+) (?P<tx>\d+) "(?P<request>[^"]*)"')
_UVICORN = re.compile(
    r'^(?:\(\w+ pid=\d+\) )?INFO:\s+(?P<client>[\d.:\[\]a-f]+) - "(?P<request>[^"]*)" (?P<status>\d{3})')
_TAIL_KV = re.compile(r'(\w+)=("[^"]*"|\S+)')
# Traefik's own access-log format ("common", its default) after the user agent: the requests since start,
# the router, the server's URL and the duration: ` 42 "vllm@docker" "http://172.18.0.3:8000" 60001ms`
_TRAEFIK_TAIL = re.compile(r'^ (?:\d+|-) "[^"]*" "(?P<url>[^"]*)" (?P<ms>\d+)ms$')
# ingress-nginx `upstreaminfo` after the user agent: request_length request_time [name] [alt] addr len time status id
# (the times as float() reads them: "1.2.3" or "." is no upstreaminfo line)
_UPSTREAMINFO = re.compile(
    r"^ \d+ (?P<rt>\d+\.?\d*|\.\d+) \[[^\]]*\] \[[^\]]*\] (?P<addr>\S+) \S+ (?P<urt>\d+\.?\d*|\.\d+|-) (?P<us>\S+)"
    r"(?: (?P<rid>\S+))?$")
# The whole ingress-nginx upstreaminfo line in one match: the common case of a large access log.
NGINX_UPSTREAMINFO = re.compile(_NGINX_ACCESS.pattern[:-len("(?P<tail>.*)$")] + _UPSTREAMINFO.pattern[1:])
_ADDR = re.compile(r"^(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-f:]+\]|[\w.-]+):\d+$")
# Any other access-log format (a custom log_format with the time or the host first, fields left out): the
# quoted request line and its status, as every format of the Common Log Format's family writes them
_REQUEST_STATUS = re.compile(r'"(?P<request>[A-Z]{3,7} \S+ HTTP/[\d.]+)" (?P<status>\d{3})(?: (?P<bytes>\d+|-)(?=\s|$))?'
                             r'(?: "(?P<referer>[^"]*)" "(?P<ua>[^"]*)")?(?P<tail>.*)$')
_CLF_TIME = re.compile(r"\[(\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d(?: [+-]\d{4})?)\]")
_ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?")
_CLIENT = re.compile(r"(?:^|[\s\[])(\d{1,3}(?:\.\d{1,3}){3}|[0-9a-f]{0,4}(?::[0-9a-f]{0,4}){2,7})(?=[\s\]])")
_ENVOY_TIMEOUT = {"UT", "SI"}
_ENVOY_CLIENT = {"DC", "DI"}
_ENVOY_UPSTREAM = {"UC", "UF", "UH", "URX", "UR", "LH", "NR"}


_CUT_OF_STATUS = {499: "client", 460: "client", 504: "timeout", 502: "upstream_failed"}
# triage.parsers.MAKES: where each access format's lines are found
MAKES = (
    ("http.access", "nginx-access", ('] "',), ()),
    ("http.access", "traefik", ('] "', '"DownstreamStatus"'), ()),  # CLF and JSON access logs
    ("http.access", "caddy", ('"handled request"', "\thandled request\t"), ()),  # JSON and console
    ("http.access", "kong", ('"latencies"',), ()),  # its log plugins' JSON (file-log, http-log, ...)
    ("http.access", "envoy", ('] "', '"response_code"'), ()),  # text and JSON access logs
    ("http.access", "nginx-access", ('"request_time"', '"upstream_response_time"'), ()),
    ("http.access", "cloudflare", ('"EdgeResponseStatus"',), ()),
    ("http.access", "haproxy", ("haproxy[",), ()),
    ("http.access", "alb", (), (r"^(?:https?|h2|grpcs?|wss?) ",)),
    ("http.access", "uvicorn", ("INFO:",), ()),
    ("http.access", "ollama", ("[GIN] ",), ()),
    ("http.access", "nginx-access", ('HTTP/1.1" ', 'HTTP/1.0" ', 'HTTP/2.0" ', 'HTTP/2" '), ()),  # any other format
)


def cut_for_status(status: int) -> str | None:
    """What a gateway status says about a cut: 499/460 client gone, 504 timeout, 502 upstream failed.
    503 is left out: an engine that is draining or not ready answers it itself, alive."""
    return _CUT_OF_STATUS.get(status)


def _f(raw: str | None) -> float | None:
    if raw is None:
        return None
    raw = raw.strip('"').split(",")[-1].split(":")[-1].strip()
    try:
        return float(raw)
    except ValueError:
        return None


def _scalar(value):
    """A JSON value as an address, an id or a user agent: None for a list or an object (no such field)."""
    return None if isinstance(value, (list, dict)) else value


def _access(fields: dict, source: str, ts, file: str, lineno: int, line: str) -> Event:
    method, _, rest = fields.get("request", "").partition(" ")
    fields["method"] = method
    fields["path"] = rest.split(" ")[0]
    fields.setdefault("cut", cut_for_status(fields["status"]))
    fields["gateway"] = source
    return Event(ts, source, "http.access", fields, file, lineno, line)


def _nginx_tail(tail: str, fields: dict) -> None:
    """Timings after the combined part: key=value pairs, or positional floats and host:port."""
    if not tail:
        return
    if m := _UPSTREAMINFO.match(tail):  # the common case, one regex
        fields["duration_s"] = float(m.group("rt"))
        fields["upstream_s"] = float(m.group("urt")) if m.group("urt") != "-" else None
        fields["upstream_addr"] = m.group("addr") if m.group("addr") != "-" else None
        fields["upstream_status"] = m.group("us")
        if m.group("rid") and m.group("rid") != "-":
            fields["request_id"] = m.group("rid")
        return
    kvs = dict(_TAIL_KV.findall(tail)) if "=" in tail else None
    if kvs:
        for key, value in kvs.items():
            k = key.lower()
            if k in ("rt", "request_time", "req_time"):
                fields["duration_s"] = _f(value)
            elif k in ("urt", "upstream_response_time", "upstream_time"):
                fields["upstream_s"] = _f(value)
            elif k in ("ua", "upstream_addr", "upstream", "upstream_address"):
                fields["upstream_addr"] = value.strip('"').split(",")[-1].strip()
            elif k in ("us", "upstream_status"):
                fields["upstream_status"] = value.strip('"')
        return
    floats = []
    for token in tail.replace("[", " ").replace("]", " ").split():
        if _ADDR.match(token):
            fields["upstream_addr"] = token
        elif "." in token and _f(token) is not None:
            floats.append(_f(token))
    if floats:
        fields["duration_s"] = floats[0]
    if len(floats) > 1:
        fields["upstream_s"] = floats[1]


def upstreaminfo_access(m: re.Match, file: str, lineno: int, line: str) -> Event:
    """parse_nginx_access's event (the same fields) from one NGINX_UPSTREAMINFO match."""
    (client, time, request, status, raw_bytes, _, ua, rt, addr, urt, us, rid) = m.groups()
    status = int(status)
    method, _, rest = request.partition(" ")
    fields = {"client": client, "request": request, "status": status,
              "bytes": int(raw_bytes) if raw_bytes != "-" else 0, "duration_s": float(rt),
              "upstream_s": float(urt) if urt != "-" else None, "upstream_addr": addr if addr != "-" else None,
              "user_agent": ua, "upstream_status": us, "method": method, "path": rest.partition(" ")[0],
              "cut": _CUT_OF_STATUS.get(status), "gateway": "nginx-access"}
    if rid and rid != "-":
        fields["request_id"] = rid
    return Event(parse_clf(time), "nginx-access", "http.access", fields, file, lineno, line)


def parse_nginx_access(line: str, file: str, lineno: int) -> Event | None:
    m = NGINX_UPSTREAMINFO.match(line)
    if m is not None:
        return upstreaminfo_access(m, file, lineno, line)
    m = _NGINX_ACCESS.match(line)
    if m is None:
        return _npm_access(line, file, lineno) if line[:1] == "[" else None
    raw_bytes = m.group("bytes")
    fields = {"client": m.group("client"), "request": m.group("request"), "status": int(m.group("status")),
              "bytes": int(raw_bytes) if raw_bytes != "-" else 0, "duration_s": None, "upstream_s": None,
              "upstream_addr": None, "user_agent": m.group("ua")}
    source = "nginx-access"
    tail = m.group("tail") or ""
    if tail.endswith("ms") and (t := _TRAEFIK_TAIL.match(tail)):
        source = "traefik"
        fields["duration_s"] = int(t.group("ms")) / 1000
        fields["upstream_addr"] = _host_port(t.group("url"))
    else:
        _nginx_tail(tail, fields)
    return _access(fields, source, parse_clf(m.group("time")), file, lineno, line)


def custom_access(line: str) -> bool:
    """Whether the per-line reading takes a line no known access format reads for an access line in a
    format of its own (parse_access_any): a quoted request line with a status in it, and not an API
    server's own uvicorn line behind another prefix (SGLang's "[<time>] INFO:     <addr> - ...": its served
    requests) nor an engine's logged prompt."""
    return ('HTTP/' in line and '" ' in line and "INFO:" not in line[:64]
            and not any(word in line for word in LOGGED_PROMPT_WORDS))  # (a request line quoted in a prompt)


def parse_access_any(line: str, file: str, lineno: int) -> Event | None:
    """An access line in a format no other parser knows (a custom log_format): the quoted request line and
    its status; the client the first address before it, the time a [dd/Mon/yyyy:HH:MM:SS zone] or an ISO-8601
    stamp before it, the timings after it as in an nginx access line (key=value, else the first number with a
    fraction is the request's time)."""
    m = _REQUEST_STATUS.search(line)
    if m is None:
        return None
    head = line[:m.start()]
    if (t := _CLF_TIME.search(head)) is not None:
        ts = parse_clf(t.group(1))
    else:
        ts = parse_iso(t.group()) if (t := _ISO_TIME.search(head)) is not None else None
    client = _CLIENT.search(head)
    raw_bytes = m.group("bytes")
    fields = {"client": client.group(1) if client else None, "request": m.group("request"),
              "status": int(m.group("status")), "bytes": int(raw_bytes) if raw_bytes not in (None, "-") else 0,
              "duration_s": None, "upstream_s": None, "upstream_addr": None, "user_agent": m.group("ua")}
    _nginx_tail(m.group("tail"), fields)
    return _access(fields, "nginx-access", ts, file, lineno, line)


def _npm_access(line: str, file: str, lineno: int) -> Event | None:
    """An Nginx Proxy Manager access line: status and upstream, no timings (its formats log none)."""
    m = _NPM.match(line)
    if m is None:
        return None
    raw_bytes, upstream = m.group("bytes"), m.group("upstream")
    fields = {"client": m.group("client"), "request": f'{m.group("method")} {m.group("uri")}',
              "status": int(m.group("status")), "bytes": int(raw_bytes) if raw_bytes != "-" else 0,
              "duration_s": None, "upstream_s": None, "upstream_addr": upstream if upstream not in (None, "-") else None,
              "user_agent": m.group("ua")}
    if m.group("us") and m.group("us") != "-":
        fields["upstream_status"] = m.group("us")
    return _access(fields, "nginx-access", parse_clf(m.group("time")), file, lineno, line)


def _host_port(url) -> str | None:
    """host:port of a server URL ("http://172.18.0.3:8000", "h2c://vllm:8000/"); None for none ("-", "")."""
    if not isinstance(url, str) or url in ("", "-"):
        return None
    return url.partition("://")[2].partition("/")[0] or None


def parse_nginx_error(line: str) -> tuple | None:
    """(ts, message, extra fields) of an nginx error-log line."""
    m = _NGINX_ERROR.match(line)
    if m is None:
        return None
    msg = m.group("msg")
    extra = {"level": m.group("level")}
    up = _UPSTREAM.search(msg)
    if up:
        extra["upstream_addr"] = up.group("addr")
    return parse_slash(m.group("ts")), msg, extra


def parse_haproxy(line: str, file: str, lineno: int) -> Event | None:
    m = _HAPROXY.search(line)
    if m is None:
        return None
    term = m.group("term")
    timers = m.group("timers").split("/")
    total_ms = _f(timers[-1].lstrip("+")) if timers else None
    # the second letter is the session's state then: Q, still waiting in the server queue (maxconn), is
    # admission under overload (the catalog's haproxy-queue-timeout), not a stream the gateway cut
    cut = None if term[1:2] == "Q" else {"s": "timeout", "c": "client", "C": "client", "S": "upstream_failed"}.get(term[0])
    fields = {"client": m.group("client"), "request": m.group("request"), "status": int(m.group("status")),
              "bytes": int(m.group("bytes")), "duration_s": total_ms / 1000 if total_ms and total_ms > 0 else None,
              "upstream_s": None, "upstream_addr": m.group("backend"), "flags": term, "cut": cut}
    return _access(fields, "haproxy", parse_clf(m.group("time")[:20] + " +0000"), file, lineno, line)


def parse_envoy(line: str, file: str, lineno: int) -> Event | None:
    m = _ENVOY.match(line)
    if m is None:
        return None
    flags = set(m.group("flags").split(","))
    status = int(m.group("status"))
    cut = _envoy_cut(flags, status)
    duration = _f(m.group("duration"))
    fields = {"request": m.group("request"), "status": status, "bytes": int(m.group("tx")),
              "duration_s": duration / 1000 if duration is not None else None,
              "upstream_s": None, "upstream_addr": m.group("upstream") or None, "flags": m.group("flags"),
              "request_id": m.group("rid") if m.group("rid") != "-" else None, "cut": cut}
    return _access(fields, "envoy", parse_iso(m.group("ts")), file, lineno, line)


def _envoy_cut(flags: set, status: int) -> str | None:
    return ("timeout" if flags & _ENVOY_TIMEOUT else "client" if flags & _ENVOY_CLIENT or status == 0
            else "upstream_failed" if flags & _ENVOY_UPSTREAM else None)


def parse_envoy_json(obj: dict, file: str, lineno: int, line: str) -> Event | None:
    """An Envoy (or Istio) JSON access-log line: a json_format of the command operators under the names
    Envoy's docs and Istio use (response_code, response_flags, duration in ms, upstream_host, start_time,
    request_id, downstream_remote_address / x_forwarded_for, method and path); None for other JSON."""
    code = obj.get("response_code")
    if code is None or "response_flags" not in obj:
        return None
    try:
        status = int(code)
    except (TypeError, ValueError):
        return None
    flags_text = str(obj.get("response_flags") or "-")
    flags = set(flags_text.split(","))
    duration = _f(str(obj["duration"])) if obj.get("duration") not in (None, "", "-") else None
    upstream = _scalar(obj.get("upstream_host"))
    client = obj.get("downstream_remote_address") or obj.get("x_forwarded_for")
    method, path = obj.get("method") or "", obj.get("path") or ""
    fields = {"client": str(client).rsplit(":", 1)[0] if client else None,
              "request": f"{method} {path} {obj.get('protocol') or ''}".strip(), "status": status,
              "bytes": obj.get("bytes_sent"), "duration_s": duration / 1000 if duration is not None else None,
              "upstream_s": None, "upstream_addr": upstream if upstream not in (None, "", "-") else None,
              "flags": flags_text, "request_id": _scalar(obj.get("request_id")) if obj.get("request_id") not in (None, "-")
              else None, "cut": _envoy_cut(flags, status)}
    ts = obj.get("start_time")
    return _access(fields, "envoy", parse_iso(ts) if isinstance(ts, str) else None, file, lineno, line)


def parse_nginx_json(obj: dict, file: str, lineno: int, line: str) -> Event | None:
    """An nginx JSON access-log line (log_format ... escape=json), its keys the variables' names: status
    with request_time or upstream_response_time, and request (or request_method and request_uri / uri),
    remote_addr, upstream_addr, time_iso8601 or time_local, request_id, http_user_agent. None for other JSON."""
    if "request_time" not in obj and "upstream_response_time" not in obj:
        return None
    try:
        status = int(obj.get("status"))
    except (TypeError, ValueError):
        return None
    if not 100 <= status <= 599:
        return None
    request = obj.get("request") or " ".join(
        str(v) for v in (obj.get("request_method") or obj.get("method"), obj.get("request_uri") or obj.get("uri"))
        if v)
    upstream = str(obj.get("upstream_addr") or "").split(",")[-1].strip()
    raw_bytes = str(obj.get("body_bytes_sent") or obj.get("bytes_sent") or "0")
    fields = {"client": _scalar(obj.get("remote_addr")), "request": str(request), "status": status,
              "bytes": int(raw_bytes) if raw_bytes.isdigit() else 0,
              # (_f reads a number or a string; "-", "" and a missing key come out None)
              "duration_s": _f(str(obj.get("request_time"))), "upstream_s": _f(str(obj.get("upstream_response_time"))),
              "upstream_addr": upstream if upstream not in ("", "-") else None,
              "user_agent": _scalar(obj.get("http_user_agent"))}
    if _scalar(obj.get("request_id")) not in (None, "", "-"):
        fields["request_id"] = obj["request_id"]
    if iso := obj.get("time_iso8601"):
        ts = parse_iso(str(iso))
    elif local := obj.get("time_local"):
        ts = parse_clf(str(local))
    else:
        ts = obj.get("time") or obj.get("timestamp") or obj.get("@timestamp")
        ts = parse_iso(ts) if isinstance(ts, str) else None
    return _access(fields, "nginx-access", ts, file, lineno, line)


def parse_traefik_json(obj: dict, file: str, lineno: int, line: str) -> Event | None:
    """A Traefik JSON access-log line (accessLog.format: json) under its field names: DownstreamStatus (what
    the client got), OriginStatus, Duration and OriginDuration in nanoseconds, ServiceAddr (or ServiceURL),
    ClientHost, RequestMethod, RequestPath, RequestProtocol, StartUTC. None for other JSON."""
    status = _http_status(obj.get("DownstreamStatus"))
    if status is None:
        return None
    duration_ns, origin_ns = _number(obj.get("Duration")), _number(obj.get("OriginDuration"))
    origin_status = _number(obj.get("OriginStatus"))
    upstream = _scalar(obj.get("ServiceAddr")) or _host_port(_scalar(obj.get("ServiceURL")))
    method, path = _scalar(obj.get("RequestMethod")) or "", _scalar(obj.get("RequestPath")) or ""
    fields = {"client": _scalar(obj.get("ClientHost")),
              "request": f"{method} {path} {_scalar(obj.get('RequestProtocol')) or ''}".strip(), "status": status,
              "bytes": int(_number(obj.get("DownstreamContentSize")) or 0),
              "duration_s": duration_ns / 1e9 if duration_ns is not None else None,
              "upstream_s": origin_ns / 1e9 if origin_ns else None, "upstream_addr": upstream or None,
              "user_agent": _scalar(obj.get("request_User-Agent")),
              "upstream_status": str(int(origin_status)) if origin_status else None}
    ts = obj.get("StartUTC") or obj.get("time")
    return _access(fields, "traefik", parse_iso(ts) if isinstance(ts, str) else None, file, lineno, line)


def parse_caddy_json(obj: dict, file: str, lineno: int, line: str) -> Event | None:
    """A Caddy access-log entry (msg "handled request", logger http.log.access.*): status, duration (seconds,
    Caddy's default duration_format, or a Go duration string), size, request.method / uri / proto /
    client_ip or remote_ip, ts (Unix seconds, Caddy's default, or an ISO time). Status 0 is a request Caddy
    wrote no response to: its reverse proxy records a client that went away before the upstream's headers
    so up to 2.10 (499 after). None for other JSON."""
    status, request = _http_status(obj.get("status"), written=False), obj.get("request")
    if status is None or not isinstance(request, dict):
        return None
    method, uri = _scalar(request.get("method")) or "", _scalar(request.get("uri")) or ""
    client = _scalar(request.get("client_ip")) or _scalar(request.get("remote_ip")) or _scalar(
        request.get("remote_addr"))
    fields = {"client": client, "request": f"{method} {uri} {_scalar(request.get('proto')) or ''}".strip(),
              "status": status, "bytes": int(_number(obj.get("size")) or 0), "duration_s": _go_seconds(obj.get("duration")),
              "upstream_s": None, "upstream_addr": None, "cut": "client" if status == 0 else cut_for_status(status)}
    ts = obj.get("ts")
    return _access(fields, "caddy", parse_iso(ts) if isinstance(ts, str) else epoch_time(ts), file, lineno, line)


def parse_kong_json(obj: dict, file: str, lineno: int, line: str) -> Event | None:
    """A Kong log plugin's entry (file-log, http-log, tcp-log: Kong's log serializer): response.status,
    latencies.request and latencies.proxy in milliseconds, upstream_status, client_ip, started_at (Unix
    milliseconds), request.method / uri, tries (the upstream's ip and port). None for other JSON."""
    response, latencies, request = obj.get("response"), obj.get("latencies"), obj.get("request")
    if not (isinstance(response, dict) and isinstance(latencies, dict) and isinstance(request, dict)):
        return None
    status = _http_status(response.get("status"))
    if status is None:
        return None
    total_ms, proxy_ms = _number(latencies.get("request")), _number(latencies.get("proxy"))
    tries = obj.get("tries")
    last = tries[-1] if isinstance(tries, list) and tries and isinstance(tries[-1], dict) else {}
    upstream = f"{last['ip']}:{last.get('port')}" if _scalar(last.get("ip")) else None
    fields = {"client": _scalar(obj.get("client_ip")),
              "request": f"{_scalar(request.get('method')) or ''} {_scalar(request.get('uri')) or ''}".strip(),
              "status": status, "bytes": int(_number(response.get("size")) or 0),
              "duration_s": total_ms / 1000 if total_ms is not None else None,
              "upstream_s": proxy_ms / 1000 if proxy_ms is not None and proxy_ms >= 0 else None,
              "upstream_addr": upstream, "upstream_status": _scalar(obj.get("upstream_status")) or None}
    if _scalar(request.get("id")):
        fields["request_id"] = request["id"]
    return _access(fields, "kong", epoch_time(obj.get("started_at")), file, lineno, line)


CADDY_CONSOLE_ACCESS = "\thandled request\t{"


def parse_caddy_console(line: str, file: str, lineno: int) -> Event | None:
    """A Caddy access entry in zap's console encoding (Caddy run in a terminal): "2024/03/12 10:15:02.118\tINFO\t
    http.log.access.log0\thandled request\t{...}", the fields as in the JSON entry."""
    at = line.find(CADDY_CONSOLE_ACCESS)
    if at < 0:
        return None
    try:
        obj = json.loads(line[at + len(CADDY_CONSOLE_ACCESS) - 1:])
    except ValueError:
        return None
    ev = parse_caddy_json(obj, file, lineno, line) if isinstance(obj, dict) else None
    if ev is not None and ev.ts is None:
        ev.ts = parse_slash(line[:19])
    return ev


_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|\u00b5s|ms|s|m|h)")


def _go_seconds(value) -> float | None:
    """Seconds of a duration logged as a number of seconds or as Go prints one ("1m0.5s", "250ms")."""
    if not isinstance(value, str):
        return _number(value)
    parts = _GO_DURATION.findall(value)
    if not parts or "".join(a + b for a, b in parts) != value:
        return _number(value)
    return sum(float(a) * _GO_UNITS[b] for a, b in parts)


# A gateway's statuses (cut_for_status), and Cloudflare's own for what happened at the origin: 524 the
# origin accepted the connection but sent no response within the proxy read timeout (100 s on most plans);
# 520 an empty or unknown response (the connection reset or closed); 521 the origin refused the connection;
# 522 the TCP connection timed out; 523 no route to it
_CLOUDFLARE_CUT = {**_CUT_OF_STATUS, 524: "timeout", **dict.fromkeys((520, 521, 522, 523), "upstream_failed")}


def epoch_time(value) -> datetime | None:
    """A Logpush timestamp: unixnano (the default), unix seconds (timestamps=unix) or RFC3339."""
    if isinstance(value, str) and not value.isdigit():
        return parse_iso(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    for scale in (1e9, 1e6, 1e3, 1.0):  # nanoseconds, microseconds, milliseconds, seconds
        if number >= 1e9 * scale or scale == 1.0:
            try:
                return datetime.fromtimestamp(number / scale, UTC).replace(tzinfo=None)
            except (OverflowError, OSError, ValueError):
                return None
    return None


def _http_status(value, written: bool = True) -> int | None:
    """A JSON access record's status as an integer, None where it is none (100-599; written=False: 0 too,
    a request no response was written to)."""
    status = _number(value)
    if status is None or not (100 <= status <= 599 or (status == 0 and not written)):
        return None
    return int(status)


def _number(value) -> float | None:
    if isinstance(value, bool) or value in (None, ""):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def parse_cloudflare_json(obj: dict, file: str, lineno: int, line: str) -> Event | None:
    """A Cloudflare HTTP request record (Logpush or Logpull, dataset http_requests) under its field names:
    EdgeResponseStatus (what the client got), OriginResponseStatus (0: the origin sent nothing),
    EdgeStartTimestamp / EdgeEndTimestamp, OriginResponseDurationMs (or the older OriginResponseTime, in
    nanoseconds), ClientIP, ClientRequestMethod, ClientRequestURI or ClientRequestPath, OriginIP, RayID,
    ClientRequestUserAgent, EdgeResponseBytes. None for other JSON."""
    status = _http_status(obj.get("EdgeResponseStatus"))
    if status is None:
        return None
    start, end = epoch_time(obj.get("EdgeStartTimestamp")), epoch_time(obj.get("EdgeEndTimestamp"))
    origin_ms = _number(obj.get("OriginResponseDurationMs"))
    if origin_ms is None and (origin_ns := _number(obj.get("OriginResponseTime"))) is not None:
        origin_ms = origin_ns / 1e6
    duration = (end - start).total_seconds() if start and end and end >= start else None
    if duration is None and origin_ms is not None:
        duration = origin_ms / 1000
    method = obj.get("ClientRequestMethod") or ""
    path = obj.get("ClientRequestURI") or obj.get("ClientRequestPath") or ""
    origin_status = _number(obj.get("OriginResponseStatus"))
    fields = {"client": _scalar(obj.get("ClientIP")), "request": f"{method} {path} {obj.get('ClientRequestProtocol') or ''}".strip(),
              "status": status, "bytes": int(_number(obj.get("EdgeResponseBytes")) or 0), "duration_s": duration,
              "upstream_s": origin_ms / 1000 if origin_ms is not None else None,
              "upstream_addr": _scalar(obj.get("OriginIP")) or None,
              "user_agent": _scalar(obj.get("ClientRequestUserAgent")),
              "upstream_status": str(int(origin_status)) if origin_status is not None else None,
              "cut": _CLOUDFLARE_CUT.get(status)}
    if _scalar(obj.get("RayID")):
        fields["request_id"] = obj["RayID"]
    return _access(fields, "cloudflare", start, file, lineno, line)


def parse_alb(line: str, file: str, lineno: int) -> Event | None:
    m = _ALB.match(line)
    if m is None or m.group("status") == "-":
        return None
    times = [_f(m.group(k)) for k in ("rpt", "tpt", "rspt")]
    total = sum(t for t in times if t is not None and t >= 0) if any(t and t > 0 for t in times) else None
    fields = {"client": m.group("client"), "request": m.group("request"), "status": int(m.group("status")),
              "bytes": int(m.group("tx")), "duration_s": total, "upstream_s": times[1],
              "upstream_addr": m.group("target") if m.group("target") != "-" else None}
    return _access(fields, "alb", parse_iso(m.group("ts")), file, lineno, line)


# Ollama's access line, Gin's logger (gin-gonic/gin logger.go defaultLogFormatter): "[GIN] 2026/02/17 - 09:04:28 |
# 200 |  5.448915218s |       10.4.0.22 | POST     \"/api/chat\"", its latency a Go duration (61.000µs, 2.1ms, 1m0s)
GIN_START = "[GIN] "
_GIN = re.compile(r'\[GIN\] (?P<ts>\d{4}/\d\d/\d\d) - (?P<hms>\d\d:\d\d:\d\d) \| (?P<status>\d{3}) \|\s*(?P<latency>[\d.hmsuµn]+) \|'
                  r'\s*(?P<client>\S+) \| (?P<method>[A-Z]+)\s+"(?P<path>[^"\s]*)"')
_GO_UNIT = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|µs|us|ns)")
_GO_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}


def go_duration(text: str) -> float | None:
    """Seconds of a Go duration's text ("1m0.5s", "5.4s", "61.000µs"), None when it is not one."""
    parts = _GO_UNIT.findall(text)
    if not parts or "".join(value + unit for value, unit in parts) != text:
        return None
    return sum(float(value) * _GO_SECONDS[unit] for value, unit in parts)


def parse_gin(line: str, file: str, lineno: int) -> Event | None:
    m = _GIN.match(line)
    if m is None:
        return None
    fields = {"client": m.group("client"), "request": f"{m.group('method')} {m.group('path')}",
              "status": int(m.group("status")), "bytes": None, "duration_s": go_duration(m.group("latency")),
              "upstream_s": None, "upstream_addr": None, "cut": None}  # (the engine's own answers: no proxy's cut)
    return _access(fields, "ollama", parse_slash(f"{m.group('ts')} {m.group('hms')}"), file, lineno, line)


def parse_uvicorn(line: str, file: str, lineno: int) -> Event | None:
    m = _UVICORN.match(line)
    if m is None:
        return None
    fields = {"client": m.group("client"), "request": m.group("request"), "status": int(m.group("status")),
              "bytes": None, "duration_s": None, "upstream_s": None, "upstream_addr": None, "cut": None}
    return _access(fields, "uvicorn", None, file, lineno, line)
