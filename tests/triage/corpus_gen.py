"""Writes the engine-log cases of the fixture corpus (run by hand: python tests/triage/corpus_gen.py).

Lines follow the real formats: this project's engine events (docs/CONTRACTS.md section 5), nginx's
ingress `upstreaminfo` access log and error log wording, loadgen's client log. Hand-written cases
(pasted-style excerpts of vLLM, TGI, Envoy, kernel...) live beside these and are not touched.
"""

import hashlib
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"
T0 = datetime(2026, 11, 29, 19, 40, 0, tzinfo=UTC)
MODEL = "builtin"


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def clf(t: datetime) -> str:
    return t.strftime("%d/%b/%Y:%H:%M:%S +0000")


def slash(t: datetime) -> str:
    return t.strftime("%Y/%m/%d %H:%M:%S")


def ev(t: datetime, event: str, level: str = "info", rid: str | None = None, **fields) -> str:
    rec = {"ts": iso(t), "level": level, "event": event, "logger": "llmserve", "model": MODEL}
    if rid:
        rec["request_id"] = rid
    rec.update(fields)
    return json.dumps(rec, separators=(",", ":"))


def h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def startup(t: datetime, **over) -> str:
    fields = dict(model_digest="3f2a9c1b", dtype="float32", device="cpu", block_size=16, num_blocks=512,
                  kv_bytes_per_token=4096, kv_cache_bytes=33554432, cache_tokens=8192, max_model_len=2048,
                  max_concurrency=4.0, prefix_caching=True, max_num_seqs=64, max_num_batched_tokens=2048,
                  weights_bytes=12582912)
    fields.update(over)
    return ev(t, "engine.startup", **fields)


def access(t: datetime, status: int, rt: float, upstream: str = "127.0.0.1:8000", nbytes: int = 2048,
           client: str = "127.0.0.1", rid: str = "") -> str:
    urt = f"{rt - 0.001:.3f}" if status != 499 else f"{rt:.3f}"
    return (f'{client} - - [{clf(t)}] "POST /v1/chat/completions HTTP/1.1" {status} {nbytes} "-" '
            f'"python-requests/2.32.3" 412 {rt:.3f} [llm-engine] [] {upstream} {nbytes} {urt} {status} '
            f'{rid or h(str(t))*4}')


def request(t: datetime, rid: str, fp: list[str], prompt_tokens: int = 64, cached: int = 0,
            ttft: float = 0.04, e2e: float = 0.9, queue_s: float = 0.002, reason: str = "stop") -> list[str]:
    return [
        ev(t, "request.received", rid=rid, prompt_tokens=prompt_tokens, max_tokens=32, stream=True,
           endpoint="/v1/chat/completions"),
        ev(t + timedelta(seconds=queue_s), "request.scheduled", rid=rid, queue_s=queue_s, cached_tokens=cached),
        ev(t + timedelta(seconds=ttft), "request.first_token", rid=rid, ttft_s=ttft),
        ev(t + timedelta(seconds=e2e), "request.finished", rid=rid, finish_reason=reason,
           prompt_tokens=prompt_tokens, cached_tokens=cached, completion_tokens=32, queue_s=queue_s, ttft_s=ttft,
           tpot_s=(e2e - ttft) / 31, e2e_s=e2e, prefix_fingerprint=fp),
        ev(t + timedelta(seconds=e2e), "http.access", method="POST", path="/v1/chat/completions", status=200,
           duration_s=e2e, client="127.0.0.1:50312"),
    ]


def random_fp(rng: random.Random, n: int = 4) -> list[str]:
    return [f"{rng.getrandbits(32):08x}" for _ in range(n)]


def write(case: str, files: dict[str, list[str]], first: str | None, cause: str | None = None) -> None:
    folder = CORPUS / case
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines))
    (folder / "expected.json").write_text(json.dumps({"first": first, "cause": cause}) + "\n")


def healthy_traffic(rng: random.Random, n: int, t: datetime, gap: float = 0.5):
    engine, nginx = [], []
    for i in range(n):
        rid = f"chatcmpl-{i:04d}"
        ti = t + timedelta(seconds=i * gap)
        e2e = 0.8 + rng.random() * 0.3
        engine += request(ti, rid, random_fp(rng), ttft=0.03 + rng.random() * 0.02, e2e=e2e)
        nginx.append(access(ti + timedelta(seconds=e2e), 200, e2e + 0.002))
    return engine, nginx


def stats(t: datetime, **over) -> str:
    fields = dict(running=2, waiting=0, kv_usage=0.12, kv_blocks_used=62, kv_blocks_total=512,
                  prefix_hit_rate=0.0, prefix_queried_tokens=1280, prefix_hit_tokens=0,
                  prompt_tokens_per_s=128.0, generation_tokens_per_s=64.0, preemptions=0)
    fields.update(over)
    return ev(t, "engine.stats", **fields)


def case_healthy(rng: random.Random) -> None:
    engine, nginx = healthy_traffic(rng, 40, T0 + timedelta(seconds=1))
    engine = [startup(T0)] + engine + [stats(T0 + timedelta(seconds=10)), stats(T0 + timedelta(seconds=20))]
    end = T0 + timedelta(seconds=22)
    # Locust stopping: the last in-flight streams are cancelled at the very end.
    for i in range(2):
        engine.append(ev(end, "request.aborted", rid=f"chatcmpl-9{i}", reason="client_disconnect",
                         tokens_sent=5, elapsed_s=0.2))
        nginx.append(access(end, 200, 0.2, nbytes=310))
    write("healthy-engine-nginx", {"engine-0.log": engine, "nginx/access.log": nginx, "nginx/error.log": [],
                                   "client-0-steady.log": []}, None)


def case_kv_preemption(rng: random.Random) -> None:
    engine = [startup(T0, num_blocks=24, cache_tokens=384, max_model_len=384, max_concurrency=1.0)]
    nginx = []
    for i in range(30):
        rid = f"chatcmpl-{i:04d}"
        ti = T0 + timedelta(seconds=1 + i * 0.8)
        engine += request(ti, rid, random_fp(rng, 6), prompt_tokens=96, ttft=0.3, e2e=4.0, queue_s=0.9)
        if i % 2 == 0:
            engine.append(ev(ti + timedelta(seconds=2), "request.preempted", "warning", rid, num_output_tokens=40))
        nginx.append(access(ti + timedelta(seconds=4), 200, 4.002))
    for k in range(1, 3):
        engine.append(stats(T0 + timedelta(seconds=10 * k), running=4, waiting=4, kv_usage=1.0, kv_blocks_used=24,
                            kv_blocks_total=24, preemptions=7))
    write("kv-preemption-engine", {"engine-0.log": engine, "nginx/access.log": nginx}, "kv-preemption")


CAPACITY_MSG = ("To serve at least one request with the model's max seq len (8192), 0.03 GiB KV cache is needed, "
                "which is larger than the available KV cache memory (0.01 GiB). Based on the available memory, "
                "the estimated maximum model length is 2048. Try increasing --kv-cache-memory / --num-kv-blocks "
                "/ --gpu-memory-utilization or decreasing --max-model-len.")


def case_kv_capacity() -> None:
    engine = [ev(T0, "engine.error", "error", phase="startup", exc_type="CapacityError", message=CAPACITY_MSG,
                 traceback="Traceback (most recent call last):\n  File \"engine/core/engine.py\", line 88, in "
                 "__init__\nengine.errors.CapacityError: " + CAPACITY_MSG + "\n", request_ids=[], fatal=True)]
    err = [f"{slash(T0 + timedelta(seconds=2 + i))} [error] 41#41: *{i + 3} connect() failed (111: Connection "
           f"refused) while connecting to upstream, client: 127.0.0.1, server: _, request: \"POST "
           f"/v1/chat/completions HTTP/1.1\", upstream: \"http://127.0.0.1:8000/v1/chat/completions\", host: "
           f"\"127.0.0.1:8080\"" for i in range(5)]
    write("kv-capacity-startup", {"engine-0.log": engine, "nginx/error.log": err}, "oom-kv-capacity",
          "kv-below-max-model-len")


def case_weights_startup() -> None:
    msg = ("Model weights take 14.19 GiB, more than the memory budget of 7.20 GiB (gpu_memory_utilization 0.9 of "
           "8.00 GiB). Try increasing --gpu-memory-utilization or a smaller model or dtype.")
    tb = ("Traceback (most recent call last):\n  File \"engine/server/builder.py\", line 37, in load_engine\n"
          "    return LLMEngine(engine_config)\nengine.errors.OutOfMemoryError: " + msg + "\n")
    engine = [ev(T0, "engine.error", "error", phase="startup", exc_type="OutOfMemoryError", message=msg,
                 traceback=tb, request_ids=[], fatal=True)]
    write("weights-startup-engine", {"engine-0.log": engine}, "oom-weights")


def case_queue(rng: random.Random) -> None:
    engine, nginx = [startup(T0, max_num_seqs=4)], []
    for i in range(40):
        rid = f"chatcmpl-{i:04d}"
        ti = T0 + timedelta(seconds=1 + i * 0.25)
        q = 0.5 + i * 0.2
        engine += request(ti, rid, random_fp(rng), ttft=q + 0.05, e2e=q + 1.0, queue_s=q)
        nginx.append(access(ti + timedelta(seconds=q + 1), 200, q + 1.002))
    for i in range(5):
        t = T0 + timedelta(seconds=9 + i * 0.1)
        engine.append(ev(t, "request.rejected", "warning", f"chatcmpl-r{i}", reason="queue_full",
                         message="Request queue full."))
        nginx.append(access(t, 429, 0.003, nbytes=140))
    engine.append(stats(T0 + timedelta(seconds=10), running=4, waiting=31, kv_usage=0.4))
    write("queue-backlog-engine", {"engine-0.log": engine, "nginx/access.log": nginx}, "queue-backlog")


def _timeout_lines(t: datetime, i: int) -> str:
    return (f"{slash(t)} [error] 41#41: *{i + 10} upstream timed out (110: Connection timed out) while reading "
            f"upstream, client: 127.0.0.1, server: _, request: \"POST /v1/chat/completions HTTP/1.1\", upstream: "
            f"\"http://127.0.0.1:8000/v1/chat/completions\", host: \"127.0.0.1:8080\"")


def case_gateway_timeout(rng: random.Random, case: str = "gateway-timeout-engine", timeout: float = 2.0) -> None:
    engine, nginx, err, client = [startup(T0)], [], [], []
    for i in range(12):
        rid = f"chatcmpl-{i:04d}"
        ti = T0 + timedelta(seconds=1 + i * 1.5)
        engine.append(ev(ti, "request.received", rid=rid, prompt_tokens=64, max_tokens=512, stream=True,
                         endpoint="/v1/chat/completions"))
        engine.append(ev(ti + timedelta(seconds=0.1), "request.first_token", rid=rid, ttft_s=0.1))
        cut = ti + timedelta(seconds=timeout + 0.1 + rng.random() * 0.5)
        engine.append(ev(cut, "request.aborted", rid=rid, reason="client_disconnect", tokens_sent=60,
                         elapsed_s=round(timeout + 0.3, 3)))
        err.append(_timeout_lines(cut, i))
        nginx.append(access(cut, 200, timeout + 0.001 + 0.1 * (i % 2), nbytes=4100))
        client.append(f"{iso(cut)} ERROR loadgen request_id=lg-{i} kind=stream_cut status=200 elapsed_s="
                      f"{timeout + 0.4:.3f} chunks=60 requests.exceptions.ChunkedEncodingError: (\"Connection "
                      f"broken: InvalidChunkLength(got length b'', 0 bytes read)\", InvalidChunkLength(got length "
                      f"b'', 0 bytes read))")
    write(case, {"engine-0.log": engine, "nginx/access.log": nginx, "nginx/error.log": err,
                 "client-0-steady.log": client}, "stream-cut-gateway-timeout")


def case_client_disconnect(rng: random.Random) -> None:
    engine, nginx, err, client = [startup(T0)], [], [], []
    for i in range(14):
        rid = f"chatcmpl-{i:04d}"
        ti = T0 + timedelta(seconds=1 + i * 1.3)
        after = 0.2 + rng.random() * 1.5
        cut = ti + timedelta(seconds=after)
        engine.append(ev(ti, "request.received", rid=rid, prompt_tokens=64, max_tokens=128, stream=True,
                         endpoint="/v1/chat/completions"))
        engine.append(ev(cut, "request.aborted", rid=rid, reason="client_disconnect", tokens_sent=5 + i,
                         elapsed_s=round(after, 3)))
        status = 499 if i % 3 == 0 else 200
        nginx.append(access(cut, status, after, nbytes=0 if status == 499 else 600))
        err.append(f"{slash(cut)} [info] 41#41: *{i + 5} epoll_wait() reported that client prematurely closed "
                   f"connection, so upstream connection is closed too while reading upstream, client: 127.0.0.1, "
                   f"server: _, request: \"POST /v1/chat/completions HTTP/1.1\", upstream: "
                   f"\"http://127.0.0.1:8000/v1/chat/completions\", host: \"127.0.0.1:8080\"")
        client.append(f"{iso(cut)} INFO loadgen request_id=lg-{i} kind=client_abort status=200 elapsed_s="
                      f"{after:.3f} chunks={5 + i} None")
    write("client-disconnect-engine", {"engine-0.log": engine, "nginx/access.log": nginx, "nginx/error.log": err,
                                       "client-0-abort.log": client}, "stream-cut-client-disconnect")


def case_proxy_buffering(rng: random.Random) -> None:
    engine, nginx = healthy_traffic(rng, 20, T0 + timedelta(seconds=1), gap=0.7)
    rows = ["request_id,outcome,ttft_s,e2e_s,num_chunks,itl_s"]
    for i in range(20):
        e2e = 1.4 + rng.random() * 0.2
        gaps = [0.0004] * 30 + [0.01]
        rows.append(f"lg-{i},ok,{e2e - 0.011:.4f},{e2e:.4f},32,\"{json.dumps(gaps)}\"")
    write("proxy-buffering-engine", {"engine-0.log": [startup(T0)] + engine, "nginx/access.log": nginx,
                                     "load/requests.csv": rows}, "stream-cut-proxy-buffering")


def case_dynamic_prefix(rng: random.Random) -> None:
    engine = [startup(T0)]
    shared = [h(f"system-{k}") for k in range(4)]
    for i in range(20):  # a healthy shared-prefix phase
        ti = T0 + timedelta(seconds=1 + i * 0.5)
        engine += request(ti, f"chatcmpl-a{i:03d}", shared + [f"{rng.getrandbits(32):08x}"],
                          prompt_tokens=80, cached=48 if i else 0)
    engine.append(stats(T0 + timedelta(seconds=10), prefix_hit_rate=0.58, prefix_hit_tokens=912,
                        prefix_queried_tokens=1580))
    for i in range(20):  # then a timestamp at the start of every system prompt
        ti = T0 + timedelta(seconds=12 + i * 0.5)
        fp = [h(f"ts-{i}")] + shared[1:] + [f"{rng.getrandbits(32):08x}"]
        engine += request(ti, f"chatcmpl-b{i:03d}", fp, prompt_tokens=80, cached=0)
    engine.append(stats(T0 + timedelta(seconds=20), prefix_hit_rate=0.0, prefix_hit_tokens=0,
                        prefix_queried_tokens=1600))
    write("dynamic-prefix-engine", {"engine-0.log": engine}, "cache-miss", "dynamic-prefix")


def case_dynamic_after_template(rng: random.Random) -> None:
    """The chat template fills block 0 the same for everyone; the timestamp lands in block 1."""
    engine = [startup(T0)]
    template, tail = h("template"), [h(f"policy-{k}") for k in range(5)]
    for i in range(16):
        ti = T0 + timedelta(seconds=1 + i * 0.5)
        fp = [template, h(f"stamp-{i}"), h(f"stamp-{i}-b")] + tail
        engine += request(ti, f"chatcmpl-{i:04d}", fp, prompt_tokens=130, cached=16)
    write("dynamic-prefix-after-template", {"engine-0.log": engine}, "cache-miss", "dynamic-prefix")


def _refused(t: datetime, i: int, upstream: str = "127.0.0.1:8000") -> str:
    return (f"{slash(t)} [error] 41#41: *{i + 40} connect() failed (111: Connection refused) while connecting to "
            f"upstream, client: 127.0.0.1, server: _, request: \"POST /v1/chat/completions HTTP/1.1\", upstream: "
            f"\"http://{upstream}/v1/chat/completions\", host: \"127.0.0.1:8080\"")


def case_engine_crash(rng: random.Random) -> None:
    engine, nginx = healthy_traffic(rng, 20, T0 + timedelta(seconds=1))
    tc = T0 + timedelta(seconds=12)
    tb = ("Traceback (most recent call last):\n  File \"engine/core/async_engine.py\", line 141, in _loop\n"
          "    result = self.engine.step()\nRuntimeError: fault injection: engine loop crashed after 20 requests\n")
    engine += [startup(T0),
               ev(tc, "engine.error", "error", phase="step", exc_type="RuntimeError",
                  message="fault injection: engine loop crashed after 20 requests", traceback=tb,
                  request_ids=["chatcmpl-0020", "chatcmpl-0021"], fatal=True),
               ev(tc, "engine.shutdown", "error", reason="fatal", drained=False, aborted=2)]
    err = [_refused(tc + timedelta(seconds=1 + i * 0.3), i) for i in range(8)]
    nginx += [access(tc + timedelta(seconds=1 + i * 0.3), 502, 0.001, nbytes=157) for i in range(8)]
    client = [f"{iso(tc + timedelta(seconds=1 + i * 0.3))} ERROR loadgen request_id=lg-{i} kind=http_status "
              f"status=502 elapsed_s=0.002 chunks=0 HTTP 502" for i in range(8)]
    write("engine-crash-engine", {"engine-0.log": engine, "nginx/access.log": nginx, "nginx/error.log": err,
                                  "client-0-steady.log": client}, "engine-crash")


OOM_MSG = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which "
           "1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB memory in use. Of the "
           "allocated memory 75.20 GiB is allocated by PyTorch, and 1.32 GiB is reserved by PyTorch but "
           "unallocated. If reserved but unallocated memory is large try setting "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def case_runtime_oom(rng: random.Random) -> None:
    engine, nginx = healthy_traffic(rng, 10, T0 + timedelta(seconds=1))
    engine.insert(0, startup(T0))
    tb = ("Traceback (most recent call last):\n  File \"engine/core/engine.py\", line 201, in step\n"
          "    logits = self.runner.execute(batch)\n  File \"engine/core/runner.py\", line 77, in execute\n"
          "torch.OutOfMemoryError: " + OOM_MSG + "\n")
    for i in range(6):
        t = T0 + timedelta(seconds=7 + i)
        rid = f"chatcmpl-e{i}"
        engine.append(ev(t, "engine.error", "error", phase="step", exc_type="OutOfMemoryError", message=OOM_MSG,
                         traceback=tb, request_ids=[rid], fatal=False))
        engine.append(ev(t, "request.finished", "error", rid, finish_reason="error", prompt_tokens=64,
                         cached_tokens=0, completion_tokens=0, queue_s=0.001, ttft_s=None, tpot_s=None, e2e_s=0.05,
                         prefix_fingerprint=random_fp(rng), error=OOM_MSG))
    write("runtime-oom-engine", {"engine-0.log": engine, "nginx/access.log": nginx}, "oom-runtime")


def case_replica_down(rng: random.Random) -> None:
    engine0, nginx = healthy_traffic(rng, 24, T0 + timedelta(seconds=1))
    engine1 = [startup(T0)]
    tk = T0 + timedelta(seconds=8)
    err = [(f"{slash(tk)} [error] 41#41: *33 upstream prematurely closed connection while reading upstream, "
            "client: 127.0.0.1, server: _, request: \"POST /v1/chat/completions HTTP/1.1\", upstream: "
            "\"http://127.0.0.1:8001/v1/chat/completions\", host: \"127.0.0.1:8080\"")]
    err += [_refused(tk + timedelta(seconds=2 * i + 1), i, "127.0.0.1:8001") for i in range(3)]
    write("replica-down", {"engine-0.log": [startup(T0)] + engine0, "engine-1.log": engine1,
                           "nginx/access.log": nginx, "nginx/error.log": err}, "engine-crash")


def case_near_miss_client(rng: random.Random) -> None:
    nginx = [access(T0 + timedelta(seconds=i * 7), 200, 3.0 + rng.random() * 4) for i in range(20)]
    for i, rt in enumerate((59.012, 58.204, 59.631, 57.940, 59.377)):
        nginx.append(access(T0 + timedelta(seconds=150 + i * 9), 499, rt, nbytes=0))
    write("near-miss-client-59s", {"access.log": nginx}, "stream-cut-client-disconnect")


def case_near_miss_gateway(rng: random.Random) -> None:
    nginx = [access(T0 + timedelta(seconds=i * 7), 200, 3.0 + rng.random() * 4) for i in range(20)]
    err = []
    for i in range(4):
        t = T0 + timedelta(seconds=150 + i * 9)
        nginx.append(access(t, 504, 60.001 + 0.001 * i, nbytes=167))
        err.append(_timeout_lines(t, i).replace("while reading upstream", "while reading response header from "
                                                "upstream"))
    write("near-miss-gateway-60s", {"access.log": nginx, "error.log": err}, "stream-cut-gateway-timeout")


def case_disabled(rng: random.Random) -> None:
    engine = [startup(T0, prefix_caching=False)]
    shared = [h(f"sys-{k}") for k in range(3)]
    for i in range(15):
        engine += request(T0 + timedelta(seconds=1 + i * 0.5), f"chatcmpl-{i:04d}", shared + [f"{i:08x}"],
                          prompt_tokens=70, cached=0)
    write("cache-disabled-engine", {"engine-0.log": engine}, "cache-miss", "disabled")


def case_eviction(rng: random.Random) -> None:
    engine = [startup(T0)]
    for k in range(8):
        high = k >= 4
        engine.append(stats(T0 + timedelta(seconds=10 * (k + 1)), running=8 if high else 2,
                            kv_usage=0.97 if high else 0.35, prefix_hit_rate=0.05 if high else 0.62,
                            prefix_hit_tokens=60 if high else 800, prefix_queried_tokens=1300))
    write("cache-eviction-engine", {"engine-0.log": engine}, "cache-miss", "eviction")


def case_routing(rng: random.Random) -> None:
    engine0, engine1, nginx = [startup(T0)], [startup(T0)], []
    shared = [h(f"tenant-{k}") for k in range(4)]
    for i in range(24):
        ti = T0 + timedelta(seconds=1 + i * 0.5)
        upstream = f"127.0.0.1:800{i % 3}"
        target = engine0 if i % 2 == 0 else engine1
        target += request(ti, f"chatcmpl-{i:04d}", shared + [f"{i:08x}"], prompt_tokens=80, cached=0)
        nginx.append(access(ti + timedelta(seconds=1), 200, 0.95, upstream=upstream, client="10.0.0.7"))
    write("cache-routing", {"engine-0.log": engine0, "engine-1.log": engine1, "nginx/access.log": nginx},
          "cache-miss", "routing")


def main() -> None:
    rng = random.Random(7)
    case_healthy(rng)
    case_kv_preemption(rng)
    case_kv_capacity()
    case_weights_startup()
    case_queue(rng)
    case_gateway_timeout(rng)
    case_client_disconnect(rng)
    case_proxy_buffering(rng)
    case_dynamic_prefix(rng)
    case_dynamic_after_template(rng)
    case_engine_crash(rng)
    case_runtime_oom(rng)
    case_replica_down(rng)
    case_near_miss_client(rng)
    case_near_miss_gateway(rng)
    case_disabled(rng)
    case_eviction(rng)
    case_routing(rng)


if __name__ == "__main__":
    main()
