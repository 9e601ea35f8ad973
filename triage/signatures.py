"""Message signatures shared by every text format: the decisive wording of engines, proxies and clients."""

import re
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Signature:
    kind: str
    keyword: str  # a plain substring checked first: most lines are rejected by `in` alone
    pattern: re.Pattern | None = None
    fields: tuple[tuple[str, str], ...] = ()  # fixed fields added to the event


def sig(kind: str, keyword: str, pattern: str | None = None, flags: int = 0, **fixed: str) -> Signature:
    return Signature(kind, keyword, re.compile(pattern, flags) if pattern else None, tuple(fixed.items()))


_GIB = r"(?P<{0}>[\d.]+ ?[KMGT]i?B)"
# The order matters only inside one line: the first match of each kind wins.
SIGNATURES: tuple[Signature, ...] = (
    # --- driver / runtime mismatch (precedes any OOM-looking failure) ---
    sig("driver.mismatch", "driver version is insufficient", cause="driver-too-old"),
    sig("driver.mismatch", "driver on your system is too old", cause="driver-too-old"),
    sig("driver.mismatch", "Driver/library version mismatch", cause="driver-library-mismatch"),
    sig("driver.mismatch", "couldn't communicate with the NVIDIA driver", cause="driver-not-loaded"),
    sig("driver.mismatch", "no kernel image is available for execution", cause="arch-mismatch"),
    sig("driver.mismatch", "forward compatibility was attempted", cause="forward-compat"),
    sig("driver.mismatch", "SYSTEM_DRIVER_MISMATCH", cause="driver-library-mismatch"),
    sig("driver.mismatch", "unsupported display driver / cuda driver combination", cause="driver-too-old"),
    sig("driver.mismatch", "cudaErrorInsufficientDriver", cause="driver-too-old"),
    sig("driver.mismatch", "Found no NVIDIA driver on your system", cause="driver-not-loaded"),
    sig("driver.mismatch", "is not compatible with the current PyTorch installation", cause="arch-mismatch"),
    sig("driver.mismatch", "CUDA driver initialization failed", cause="driver-not-loaded"),
    sig("driver.mismatch", "PTX was compiled with an unsupported toolchain", cause="driver-too-old"),
    sig("driver.mismatch", "cannot open shared object file",
        r"lib(?:cuda|cudart|nvidia-ml|cublas|cudnn|nccl)[\w.-]*\.so[\w.]*: cannot open shared object file",
        cause="cuda-library-missing"),
    # --- KV capacity at start-up (vLLM v1, v0, this engine, TGI, llama.cpp) ---
    sig("oom.kv_capacity", "To serve at least one request with the model",
        r"max seq len \((?P<max_model_len>\d+)\), \(?(?P<needed>[\d.]+) GiB KV cache is needed.*?"
        r"available KV cache memory \((?P<available>[\d.]+) GiB\)(?:.*?estimated maximum model length is "
        r"(?P<estimated_max_len>\d+))?", cause="kv-below-max-model-len"),
    sig("oom.kv_capacity", "No available memory for the cache blocks", cause="no-kv-memory"),
    sig("oom.kv_capacity", "larger than the maximum number of tokens that can be stored in KV cache",
        r"max seq len \((?P<max_model_len>\d+)\)", cause="kv-below-max-model-len"),
    sig("oom.kv_capacity", "out of memory occurred when warming up", cause="warmup"),
    sig("oom.kv_capacity", "Not enough memory to handle", cause="warmup"),
    sig("oom.kv_capacity", "on startup is less than desired GPU memory utilization", cause="gpu-occupied"),
    sig("oom.kv_capacity", "failed to allocate buffer for kv cache", cause="no-kv-memory"),
    sig("oom.kv_capacity", "llama_init_from_model: failed to initialize the context", cause="no-kv-memory"),
    sig("oom.kv_capacity", "Please try to increase --mem-fraction-static", cause="no-kv-memory"),
    sig("oom.kv_capacity", "Not enough memory. Please try to increase", cause="no-kv-memory"),
    # --- weights larger than memory (Ollama, llama.cpp) ---
    sig("oom.weights", "model requires more system memory", cause="host-memory"),
    sig("oom.weights", "cudaMalloc failed: out of memory", r"allocating (?P<tried>[\d.]+ MiB)"),
    sig("oom.weights", "unable to allocate", r"unable to allocate (?:\w+ )?(?:backend )?buffer"),
    # --- CUDA / PyTorch allocator OOM, every era ---
    sig("oom.cuda", "out of memory",
        r"(?:CUDA|HIP|MPS) out of memory\. Tried to allocate (?P<tried>[\d.]+ [KMGT]iB)"
        r"(?:.*?(?:GPU (?P<gpu>\d+); (?P<total>[\d.]+ [KMGT]iB) total capacity|"
        r"GPU (?P<gpu2>\d+) has a total capac(?:i)?ty of (?P<total2>[\d.]+ [KMGT]iB) "
        r"of which (?P<free>[\d.]+ [KMGT]iB) is free))?"),
    sig("oom.cuda", "CUDA error: out of memory"),
    sig("oom.cuda", "CUBLAS_STATUS_ALLOC_FAILED"),
    sig("oom.cuda", "OutOfMemoryError", r"\b(?:torch\.(?:cuda\.)?)?OutOfMemoryError\b"),
    # --- host OOM killer, Kubernetes ---
    sig("oom.host", "Killed process", r"Killed process (?P<pid>\d+) \((?P<process>.+?)\) total-vm"),
    sig("oom.host", "invoked oom-killer", r"(?P<process>\S+) invoked oom-killer"),
    sig("oom.host", "OOMKilled", r"\bOOMKilled\b"),
    sig("oom.host", "Memory cgroup out of memory"),
    # --- engine death ---
    sig("engine.fatal", "EngineCore encountered a fatal error"),
    sig("engine.fatal", "EngineDeadError"),
    sig("engine.fatal", "died unexpectedly", r"Engine core proc \S+ died unexpectedly", weak="1"),
    sig("engine.fatal", "AsyncLLM output_handler failed"),
    sig("engine.fatal", "Engine core initialization failed", startup="1"),
    sig("engine.fatal", "EngineCore failed to start", startup="1"),
    sig("engine.fatal", "Shard process was signaled to shutdown"),
    sig("engine.fatal", "Shard", r"Shard \d+ (?:failed|crashed|terminated)|ShardCannotStart|ShardFailed"),
    sig("engine.fatal", "Webserver Crashed"),
    sig("engine.fatal", "Scheduler hit an exception"),
    sig("engine.fatal", "llama runner process has terminated"),
    sig("engine.fatal", "Stub process is unhealthy"),
    sig("engine.fatal", "illegal memory access was encountered"),
    sig("engine.fatal", "device-side assert triggered"),
    sig("engine.fatal", "unspecified launch failure"),
    sig("engine.fatal", "NCCL error"),
    sig("engine.fatal", "Watchdog caught collective operation timeout"),
    sig("engine.fatal", "Segmentation fault"),
    sig("engine.fatal", "Fatal Python error"),
    sig("engine.fatal", "GGML_ASSERT"),
    sig("engine.fatal", "CrashLoopBackOff", weak="1"),
    sig("engine.fatal", "failed (engine dead)"),
    # --- preemption (vLLM v0, v1 stats, SGLang retraction) ---
    sig("engine.preemption", "is preempted by PreemptionMode",
        r"total_(?:num_)?cumulative_preemption(?:_cnt)?=(?P<total>\d+)"),
    sig("engine.preemption", "Retract requests"),
    # --- overload ---
    sig("queue.full", "Request queue full"),
    sig("queue.full", "Model is overloaded"),
    sig("queue.full", "maximum pending requests exceeded"),
    sig("queue.full", "Error code: 429"),
    sig("queue.full", "Too Many Requests", r"\b429\b.*Too Many Requests|Too Many Requests.*\b429\b"),
    # --- context overflow ---
    sig("context.overflow", "maximum context length is",
        r"maximum context length is (?P<max_model_len>\d+) tokens\. However, you requested (?P<requested>\d+)"),
    sig("context.overflow", "must be <=", r"`?inputs`? tokens \+ `?max_new_tokens`? must be <="),
    sig("context.overflow", "longer than the maximum model length",
        r"\(length (?P<requested>\d+)\) is longer than the maximum model length of (?P<max_model_len>\d+)"),
    sig("context.overflow", "is too long and exceeds limit of",
        r"\((?P<requested>\d+) tokens\) is too long and exceeds limit of (?P<max_model_len>\d+)"),
    sig("context.overflow", "exceeds the available context size"),
    sig("context.overflow", "exceed_context_size_error"),
    sig("context.overflow", "longer than the model's context length"),
    sig("context.overflow", "truncating input prompt", r"limit=(?P<max_model_len>\d+) prompt=(?P<requested>\d+)"),
    # --- gateways: nginx error log wording ---
    sig("gateway.upstream_timeout", "upstream timed out",
        r"upstream timed out \(110: (?:Connection|Operation) timed out\) while (?P<phase>reading response header from upstream|reading upstream|connecting to upstream|sending request to upstream)"),
    sig("gateway.client_closed", "client prematurely closed connection"),
    sig("gateway.client_closed", "while sending to client",
        r"(?:writev|sendfile|send|SSL_write)\(\) failed \((?:32: Broken pipe|104: Connection reset by peer)\) while sending to client"),
    # send_timeout / client_body_timeout: the client stopped reading or sending, and nginx closed on it
    sig("gateway.client_closed", "client timed out", r"client timed out \(110: (?:Connection|Operation) timed out\) while"),
    sig("gateway.connect_refused", "Connection refused) while connecting to upstream"),
    sig("gateway.connect_refused", "no live upstreams"),
    sig("gateway.upstream_closed", "upstream prematurely closed connection",
        r"upstream prematurely closed connection while (?P<phase>reading response header from upstream|reading upstream)"),
    sig("gateway.upstream_closed", "Connection reset by peer) while reading", r"recv\(\) failed \(104: Connection reset by peer\) while reading (?P<phase>response header from upstream|upstream)"),
    # --- Envoy / ALB / Cloudflare bodies and HTML error pages ---
    sig("gateway.upstream_timeout", "upstream request timeout", phase="envoy"),
    sig("gateway.upstream_timeout", "stream timeout", r"^stream timeout$", phase="envoy-idle"),
    sig("gateway.connect_refused", "upstream connect error or disconnect/reset before headers"),
    sig("gateway.connect_refused", "no healthy upstream"),
    sig("http.error_page", "Gateway Time", r"(?:<title>|<h1>)\s*(?P<status>504) Gateway Time-?out", status="504"),
    sig("http.error_page", "Bad Gateway", r"(?:<title>|<h1>)\s*(?P<status>502) Bad Gateway"),
    sig("http.error_page", "Service Unavailable", r"(?:<title>|<h1>)\s*(?P<status>503) Service (?:Temporarily )?Unavailable"),
    sig("http.error_page", "Error code 524", status="504"),
    sig("http.error_page", "status of 50", r"responded with a status of (?P<status>50[234])"),
    sig("http.error_page", "Error code: 50", r"Error code: (?P<status>50[234])"),
    # --- clients: SDKs, HTTP libraries, browsers ---
    sig("client.stream_cut", "incomplete chunked read"),
    sig("client.stream_cut", "RemoteProtocolError"),
    sig("client.stream_cut", "ChunkedEncodingError"),
    sig("client.stream_cut", "Response payload is not completed"),
    sig("client.stream_cut", "ERR_INCOMPLETE_CHUNKED_ENCODING"),
    sig("client.stream_cut", "IncompleteRead"),
    sig("client.stream_cut", "ServerDisconnectedError"),
    sig("client.timeout", "ReadTimeout"),
    sig("client.timeout", "Read timed out"),
    sig("client.timeout", "APITimeoutError"),
    sig("client.timeout", "Request timed out"),
    sig("client.timeout", "ServerTimeoutError"),
    sig("client.timeout", "asyncio.exceptions.TimeoutError"),
    sig("client.cancel", "AbortError"),
    sig("client.cancel", "BodyStreamBuffer was aborted"),
    sig("client.cancel", "net::ERR_ABORTED"),
    sig("client.connect_refused", "Connection refused", r"\[Errno 111\] Connection refused|ECONNREFUSED|Cannot connect to host"),
    sig("client.connect_refused", "ECONNREFUSED"),
    sig("client.connect_refused", "APIConnectionError"),
    # --- configuration that decides prefix caching ---
    sig("cache.config", "prefix caching", r"Using prefix caching = (?P<enabled>True|False)|Prefix caching (?P<enabled2>true|false)"),
    sig("cache.config", "Disabling prefix caching", enabled="False"),
    sig("cache.config", "enable_prefix_caching", r"enable_prefix_caching['\"]?\s*[:=]\s*(?P<enabled>True|False)"),
    sig("cache.config", "disable_radix_cache", r"disable_radix_cache['\"]?\s*[:=]\s*(?P<disabled>True|False)"),
    # --- nginx configuration (a proxy that buffers SSE) ---
    sig("config.proxy_buffering", "proxy_buffering", r"^\s*proxy_buffering\s+(?P<value>on|off)\s*;"),
    sig("config.proxy_buffering", "X-Accel-Buffering", r"X-Accel-Buffering:?\s*\"?(?P<value>yes|no)", re.I),
)
_KEY_FIXUPS = {"gpu2": "gpu", "total2": "total", "enabled2": "enabled"}


def scan(message: str) -> list[tuple[str, dict]]:
    """Every signature kind found in one message, with the fields its pattern extracts."""
    found: list[tuple[str, dict]] = []
    kinds: set[str] = set()
    for s in SIGNATURES:
        if s.kind in kinds or s.keyword not in message:
            continue
        fields: dict = dict(s.fields)
        if s.pattern is not None:
            m = s.pattern.search(message)
            if m is None:
                continue
            for key, value in m.groupdict().items():
                if value is not None:
                    fields[_KEY_FIXUPS.get(key, key)] = value
        kinds.add(s.kind)
        found.append((s.kind, fields))
    return found
