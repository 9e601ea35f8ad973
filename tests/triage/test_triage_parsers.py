"""Parsers: each real format recognised from content, with the fields rules depend on."""

import json
from datetime import datetime

import pytest

from triage.parsers import FileParser
from triage.signatures import scan


def parse(line: str, parser: FileParser | None = None):
    p = parser or FileParser("f.log")
    return p.parse(1, line)


def kinds(line: str) -> list[str]:
    return [e.kind for e in parse(line)]


def test_engine_json_event():
    line = ('{"ts":"2026-11-29T19:40:01.123Z","level":"info","event":"request.finished","logger":"llmserve",'
            '"model":"builtin","request_id":"r1","finish_reason":"stop","ttft_s":0.05,"prefix_fingerprint":["a"]}')
    [ev] = parse(line)
    assert (ev.kind, ev.source, ev.fields["request_id"]) == ("request.finished", "engine-json", "r1")
    assert ev.ts == datetime(2026, 11, 29, 19, 40, 1, 123000)


def test_engine_text_format():
    line = '2026-11-29T19:40:01.123Z WARNING request.preempted model=builtin request_id=r7 num_output_tokens=12'
    [ev] = parse(line)
    assert ev.kind == "request.preempted" and ev.fields["num_output_tokens"] == 12


def test_engine_error_also_yields_signatures():
    line = ('{"ts":"2026-11-29T19:40:01.123Z","level":"error","event":"engine.error","logger":"llmserve",'
            '"phase":"step","exc_type":"OutOfMemoryError","message":"CUDA out of memory. Tried to allocate 2.00 GiB.'
            ' GPU 0 has a total capacity of 79.11 GiB of which 1.06 GiB is free.","fatal":false}')
    evs = parse(line)
    assert [e.kind for e in evs] == ["engine.error", "oom.cuda"]
    assert evs[1].fields["tried"] == "2.00 GiB" and evs[1].fields["free"] == "1.06 GiB"


@pytest.mark.parametrize("lines, want", [
    (["    State:          Running",  # (kubectl describe: the running state's start, then the last run)
      "      Started:      Wed, 02 Jul 2025 20:41:17 +0000",
      "    Last State:     Terminated",
      "      Reason:       OOMKilled",
      "      Exit Code:    137",
      "      Started:      Wed, 02 Jul 2025 11:02:44 +0200",
      "      Finished:     Wed, 02 Jul 2025 20:41:09 +0200"],
     [(7, datetime(2025, 7, 2, 9, 2, 44), datetime(2025, 7, 2, 18, 41, 9), 34705.0)]),
    (['        finishedAt: "2025-08-14T17:26:52Z"', "        reason: OOMKilled",
      '        startedAt: "2025-08-14T14:05:10Z"'],
     [(3, datetime(2025, 8, 14, 14, 5, 10), datetime(2025, 8, 14, 17, 26, 52), 12102.0)]),
    (['            "StartedAt": "2024-10-21T05:00:11.123456789Z",', '            "FinishedAt": "2024-10-21T05:02:41.5Z"'],
     [(2, datetime(2024, 10, 21, 5, 0, 11, 123456), datetime(2024, 10, 21, 5, 2, 41, 500000), 150.376544)]),
    (['"StartedAt": "2024-10-21T05:00:11Z",', "a", "b", "c", '"FinishedAt": "2024-10-21T05:02:41Z"'], []),  # (apart)
    (['"StartedAt": "2024-10-21T05:00:11Z",', '"FinishedAt": "0001-01-01T00:00:00Z"'], []),  # (never finished)
    (['"StartedAt": "2024-10-21T05:00:11Z",', '"FinishedAt": "2024-10-21T05:00:10Z"'], []),  # (before it started)
    (["INFO 07-02 11:02:44 [api_server.py:1880] Started: server process [1]", "Finished: warm-up"], []),
])
def test_a_containers_last_run_is_read_from_its_start_and_finish(lines, want):
    """kubectl describe, kubectl get -o yaml and docker inspect print a container's last start and finish on
    lines next to each other: one container.ran event each, at the second line, with the seconds between."""
    p = FileParser("f.log")
    got = [(ev.line, ev.fields["started"], ev.fields["finished"], ev.fields["seconds"])
           for n, line in enumerate(lines, 1) for ev in p.parse(n, line) if ev.kind == "container.ran"]
    assert got == want


def test_sglang_logged_request_is_a_prompt():
    line = ("[2025-03-03 16:41:05] Receive: obj=GenerateReqInput(text='<|im_start|>system\\n[trace_id=77ad02f9 "
            "ts=1741016465.971]\\nYou are an extraction engine. CUDA out of memory is a phrase here.', input_ids=None, "
            "input_embeds=None, image_data=None, sampling_params={'max_new_tokens': 512}, rid='97552ea9c9c2', "
            "return_logprob=False)")
    [ev] = parse(line)
    assert (ev.kind, ev.source, ev.fields["request_id"]) == ("request.received", "sglang", "97552ea9c9c2")
    assert ev.fields["prompt"].startswith("<|im_start|>system\\n[trace_id=") and ev.fields["prompt"].endswith("here.")


def test_production_stack_router_line_is_a_routing_choice():
    line = ("[2025-10-03 12:04:14,877] INFO: Routing request 7b3e9d10-2c44 with session id None to http://10.1.4.22:8000"
            " at 1759493054.8772, process time = 0.0009 (request.py:600:vllm_router.services.request_service.request)")
    [ev] = parse(line)
    assert (ev.kind, ev.fields) == ("request.routed", {"request_id": "7b3e9d10-2c44", "client": None,
                                                       "upstream_addr": "10.1.4.22:8000"})
    [ev] = parse(line.replace("session id None", "session id user-42"))
    assert ev.fields["client"] == "user-42"


@pytest.mark.parametrize("latency, seconds", [("5.448915218s", 5.448915218), ("61.000µs", 61e-6), ("2.1ms", 0.0021),
                                              ("1m0s", 60.0), ("1h2m3.5s", 3723.5)])
def test_ollama_gin_access_line(latency, seconds):
    """Ollama's Gin access line is an access event (the engine's own answer: no proxy's cut), its latency a Go
    duration; a 500's line is read by the catalog as well."""
    line = f'[GIN] 2026/02/17 - 09:04:28 | 500 | {latency:>14} |       10.4.0.22 | POST     "/api/chat"'
    ev = parse(line)[0]
    assert (ev.kind, ev.source, ev.fields["status"], ev.fields["path"], ev.fields["cut"]) == (
        "http.access", "ollama", 500, "/api/chat", None)
    assert ev.fields["duration_s"] == pytest.approx(seconds) and ev.ts == datetime(2026, 2, 17, 9, 4, 28)
    assert [e.kind for e in parse(line)][1:] == (["gateway.client_closed"] if seconds >= 60 else [])


def test_a_log_line_as_a_member_of_pretty_printed_json_is_read_as_the_line():
    """A Kibana or CloudWatch export's document, pretty-printed: the member that holds the log line is decoded
    (an Envoy JSON access line inside it, escaped) and read as the line itself, quoted whole."""
    inner = ('{"start_time":"2025-10-21T16:04:44.000Z","method":"POST","x-envoy-origin-path":"/v1/chat/completions",'
             '"response_code":200,"response_flags":"UT","duration":15001,"upstream_host":"10.244.3.17:8000"}')
    line = '      "message": ' + json.dumps(inner) + ","
    [ev] = parse(line)
    assert (ev.kind, ev.source, ev.fields["status"], ev.fields["cut"], ev.text) == (
        "http.access", "envoy", 200, "timeout", line)
    vllm = '  "_raw": "(APIServer pid=1) INFO 10-21 16:04:59 [async_llm.py:494] Aborted request(s) chatcmpl-a6."'
    [ev] = parse(vllm)
    assert (ev.kind, ev.source, ev.fields["request_ids"]) == ("request.aborted", "vllm", ["chatcmpl-a6"])


def test_nginx_upstreaminfo_access():
    line = ('127.0.0.1 - - [29/Nov/2026:19:40:01 +0000] "POST /v1/chat/completions HTTP/1.1" 499 0 "-" '
            '"python-requests/2.32.3" 412 59.012 [llm-engine] [] 127.0.0.1:8000 0 59.011 - 3f2a')
    [ev] = parse(line)
    f = ev.fields
    assert (ev.kind, f["status"], f["cut"], f["duration_s"], f["upstream_s"], f["upstream_addr"]) == (
        "http.access", 499, "client", 59.012, 59.011, "127.0.0.1:8000")
    assert f["request_id"] == "3f2a"


def test_nginx_key_value_timings():
    line = ('10.0.0.1 - - [29/Nov/2026:19:40:01 +0000] "POST /v1/completions HTTP/1.1" 504 167 "-" "curl" '
            'rt=60.001 uct="0.000" urt="60.000" ua="10.0.0.5:8000"')
    [ev] = parse(line)
    assert (ev.fields["cut"], ev.fields["duration_s"], ev.fields["upstream_addr"]) == ("timeout", 60.001,
                                                                                      "10.0.0.5:8000")


@pytest.mark.parametrize(("line", "want"), [
    # log_format with the time first, the request time last
    ('[09/May/2025:10:13:33 +0000] 10.0.0.7 "POST /v1/chat/completions HTTP/1.1" 504 167 60.001',
     ("10.0.0.7", 504, "timeout", 60.001, datetime(2025, 5, 9, 10, 13, 33))),
    # an ISO time first, no bytes, the user agent after the timings
    ('2025-05-09T10:13:33+00:00 10.0.0.7 "POST /v1/chat/completions HTTP/1.1" 499 12.003 "OpenAI/Python 1.51.0"',
     ("10.0.0.7", 499, "client", 12.003, datetime(2025, 5, 9, 10, 13, 33))),
    # a host and the server first, key=value timings
    ('llm.example.com 10.0.0.8 - [09/May/2025:10:13:34 +0000] "POST /v1/completions HTTP/2.0" 200 2048 "-" "curl/8.5" '
     'request_time=0.912 upstream_addr=10.0.3.7:8000', ("10.0.0.8", 200, None, 0.912, datetime(2025, 5, 9, 10, 13, 34))),
    # stern's pod and container before an access line
    ('ingress-nginx-7c9f-x2k ingress 10.0.0.9 - - [09/May/2025:10:13:35 +0000] "GET /v1/models HTTP/1.1" 502 150 "-" "-"',
     ("10.0.0.9", 502, "upstream_failed", None, datetime(2025, 5, 9, 10, 13, 35))),
])
def test_an_access_line_in_a_format_of_its_own(line, want):
    [ev] = parse(line, FileParser("access.log"))
    f = ev.fields
    assert (ev.kind, ev.source) == ("http.access", "nginx-access")
    assert (f["client"], f["status"], f["cut"], f["duration_s"], ev.ts) == want


@pytest.mark.parametrize("line", [
    # a quoted request not followed by its status: an nginx error line's, HAProxy's last field
    '2024/05/01 12:00:00 [error] 31#31: *1 upstream timed out (110: Connection timed out) while reading upstream, '
    'client: 1.2.3.4, server: _, request: "POST /v1/chat/completions HTTP/1.1", upstream: "http://10.0.3.7:8000/"',
    'request failed: "POST /v1/chat/completions HTTP/1.1" after 3 tries',
    # SGLang's own uvicorn line (its served requests, read as the run's lines are)
    '[2025-06-01 10:00:05] INFO:     127.0.0.1:40000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
])
def test_other_lines_with_a_request_are_no_access_lines(line):
    assert [e.kind for e in parse(line, FileParser("any.log"))] != ["http.access"]


@pytest.mark.parametrize("line", [
    # a logged prompt that quotes an access line (a user asking about their nginx log) is a prompt
    "(APIServer pid=1) INFO 11-29 19:00:00 [logger.py:43] Received request chatcmpl-1: prompt: 'why did "
    '10.0.0.7 - - [29/Nov/2026:19:00:00 +0000] "POST /v1/chat/completions HTTP/1.1" 504 167 time out?\', '
    "params: SamplingParams(n=1), prompt_token_ids: None, lora_request: None.",
    "(APIServer pid=1) DEBUG 11-29 19:00:00 [logger.py:49] Request cmpl-1 details: prompt: 'explain "
    '"GET /v1/models HTTP/1.1" 502 please\', prompt_token_ids: [1, 2], prompt_embeds shape: None.',
])
def test_a_logged_prompt_quoting_a_request_is_a_prompt(line):
    assert [e.kind for e in parse(line, FileParser("vllm.log"))] == ["request.received"]


def test_nginx_error_line():
    line = ('2024/05/01 12:00:00 [error] 31#31: *123 upstream timed out (110: Connection timed out) while reading '
            'upstream, client: 1.2.3.4, server: _, request: "POST /v1/chat/completions HTTP/1.1", upstream: '
            '"http://10.0.0.5:8000/v1/chat/completions", host: "api.example"')
    [ev] = parse(line)
    assert (ev.kind, ev.fields["phase"], ev.fields["upstream_addr"]) == (
        "gateway.upstream_timeout", "reading upstream", "10.0.0.5:8000")
    assert ev.ts == datetime(2024, 5, 1, 12, 0, 0)


def test_vllm_stats_line_old_and_new():
    old = ("INFO 05-21 21:11:56 [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation "
           "throughput: 2.0 tokens/s, Running: 8 reqs, Waiting: 3 reqs, GPU KV cache usage: 12.3%, "
           "Prefix cache hit rate: 45.6%")
    [ev] = parse(old)
    assert ev.fields == {"running": 8, "waiting": 3, "kv_usage": pytest.approx(0.123),
                         "prefix_hit_rate": pytest.approx(0.456)}
    new = old.replace("Waiting: 3 reqs, ", "Waiting: 3 reqs, Preemptions: 4, ")
    assert parse(new)[0].fields["preemptions"] == 4


def test_traceback_frames_attach_to_oom():
    p = FileParser("vllm.log")
    lines = ["Traceback (most recent call last):",
             '  File "/x/vllm/model_executor/model_loader/base_loader.py", line 50, in load_model',
             "    self.load_weights(model, model_config)",
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB."]
    evs = [e for i, line in enumerate(lines, 1) for e in p.parse(i, line)]
    assert [e.kind for e in evs] == ["oom.cuda"]
    assert evs[0].fields["frames"] == ["load_model"] and evs[0].line == 4


def test_oom_every_era():
    old = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 4; 31.75 GiB total capacity; "
           "30.29 GiB already allocated; 3.75 MiB free; 30.40 GiB reserved in total by PyTorch)")
    typo = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 462.00 MiB. GPU 0 has a total "
            "capacty of 79.18 GiB of which 302.31 MiB is free.")
    assert scan(old)[0][1] == {"signature": "torch-cuda-oom", "tried": "20.00 MiB", "gpu": "4", "total": "31.75 GiB"}
    assert scan(typo)[0][1] == {"signature": "torch-cuda-oom", "tried": "462.00 MiB", "gpu": "0", "total": "79.18 GiB",
                                "free": "302.31 MiB"}
    assert scan("RuntimeError: CUDA error: out of memory")[0][0] == "oom.cuda"


def test_capacity_refusal_both_spellings():
    ours = ("To serve at least one request with the model's max seq len (8192), 0.03 GiB KV cache is needed, which "
            "is larger than the available KV cache memory (0.01 GiB). Based on the available memory, the estimated "
            "maximum model length is 2048. Try increasing --kv-cache-memory")
    vllm = ours.replace("model's", "models's").replace("(8192), 0.03", "(8192), (0.03")
    for text in (ours, vllm):
        kind, fields = scan(text)[0]
        assert kind == "oom.kv_capacity"
        assert (fields["max_model_len"], fields["needed"], fields["available"], fields["estimated_max_len"]) == (
            "8192", "0.03", "0.01", "2048")


def test_envoy_haproxy_alb_cuts():
    envoy = ('[2026-03-04T10:12:45.012Z] "POST /v1/chat/completions HTTP/1.1" 504 UT 412 24 15001 - "10.1.0.4" '
             '"ua" "rid-1" "llm.internal" "10.1.3.7:8000"')
    haproxy = ('Nov 29 19:40:01 lb1 haproxy[2231]: 10.0.0.21:51544 [29/Nov/2026:19:39:01.112] fe be/v1 0/0/1/-1/60002 '
               '504 194 - - sH-- 3/3/1/1/0 0/0 "POST /v1/chat/completions HTTP/1.1"')
    alb = ('h2 2026-11-29T19:40:01.412345Z app/lb/5 192.168.1.3:2817 10.0.0.1:8000 0.002 30.000 -1 460 - 125 0 '
           '"POST https://x:443/v1/chat/completions HTTP/2.0" "ua"')
    got = [(e.source, e.fields["cut"], e.fields["duration_s"]) for line in (envoy, haproxy, alb) for e in parse(line)]
    assert got == [("envoy", "timeout", 15.001), ("haproxy", "timeout", 60.002), ("alb", "client", 30.002)]


def test_loadgen_client_log_and_csv():
    text = ("2026-11-29T19:40:01.123Z ERROR loadgen request_id=a1 kind=stream_cut status=200 elapsed_s=1.204 "
            "chunks=7 requests.exceptions.ChunkedEncodingError: boom")
    [ev] = parse(text)
    assert (ev.kind, ev.fields["request_id"], ev.fields["elapsed_s"]) == ("client.stream_cut", "a1", 1.204)
    with_response = text.replace("request_id=a1 ", "request_id=a1 response_id=chatcmpl-9 ").replace(
        "kind=stream_cut", "kind=client_abort")
    [ev] = parse(with_response)
    assert (ev.kind, ev.fields["request_id"], ev.fields["client_request_id"]) == ("client.cancel", "chatcmpl-9", "a1")
    p = FileParser("r.csv")
    assert p.parse(1, "request_id,outcome,ttft_ms,e2e_ms") == []
    [row] = p.parse(2, "x,ok,1500,1600")
    assert (row.kind, row.fields["ttft_s"], row.fields["e2e_s"]) == ("client.request", 1.5, 1.6)


def test_prometheus_exposition_and_nvidia_smi():
    p = FileParser("m.txt")
    assert p.parse(1, "# TYPE vllm:num_preemptions_total counter") == []
    [ev] = p.parse(2, 'vllm:num_preemptions_total{engine="0",model_name="m"} 12.0')
    assert (ev.fields["metric"], ev.fields["increase"], ev.fields["labels"]["engine"]) == ("preemptions_total",
                                                                                         12.0, "0")
    [smi] = parse("| NVIDIA-SMI 470.182.03   Driver Version: 470.182.03   CUDA Version: 11.4     |")
    assert (smi.kind, smi.fields["cuda"]) == ("gpu.driver", "11.4")


def test_plain_prose_is_not_a_metric():
    assert kinds("Running 5") == [] and kinds("hello world") == []


def test_docker_json_wrapped_line():
    line = ('{"log":"2024/05/01 12:00:00 [error] 31#31: *1 no live upstreams while connecting to upstream, '
            'client: 1.2.3.4\\n","stream":"stderr","time":"2024-05-01T12:00:00.1Z"}')
    [ev] = parse(line)
    assert ev.kind == "gateway.connect_refused" and ev.text == line


@pytest.mark.parametrize("line, kind, cause", [
    ("ImportError: libcudart.so.12: cannot open shared object file: No such file or directory", "driver.mismatch",
     "cuda-library-missing"),
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device", "driver.mismatch",
     "arch-mismatch"),
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", "oom.kv_capacity",
     "no-kv-memory"),
    ("ValueError: Free memory on device cuda:0 (12.18/23.56 GiB) on startup is less than desired GPU memory "
     "utilization (0.92, 21.67 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     "oom.weights", "gpu-occupied"),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
     "initializing the engine.", "oom.kv_capacity", "no-kv-memory"),
    ("llama_model_load: error loading model: unable to allocate CUDA0 buffer", "oom.weights", None),
])
def test_signatures_with_cause(line, kind, cause):
    found = dict(scan(line))
    assert kind in found and found[kind].get("cause") == cause


@pytest.mark.parametrize("line, kind", [
    ("INFO 04-02 10:00:05 model_runner.py:1008] Loading model weights took 13.9717 GB", "phase.weights_loaded"),
    ("(EngineCore_DP0 pid=9) INFO 08-14 09:12:41 [gpu_model_runner.py:1953] Model loading took 15.2683 GiB and "
     "9.84 seconds", "phase.weights_loaded"),
    ("(EngineCore_DP0 pid=9) INFO 08-14 09:12:30 [gpu_model_runner.py:1900] Starting to load model m...",
     "phase.weights_loading"),
    ("(EngineCore_DP0 pid=9) INFO 08-14 09:12:52 [gpu_worker.py:276] Available KV cache memory: 10.91 GiB",
     "phase.kv_setup"),
    ("(APIServer pid=1) INFO:     Application startup complete.", "phase.serving"),
])
def test_startup_phase_markers(line, kind):
    assert kinds(line) == [kind]


def test_prompt_text_is_not_scanned_for_errors():
    line = ("(APIServer pid=1) INFO 10-02 11:00:01 [logger.py:43] Received request chatcmpl-1: prompt: 'Why do I get "
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB?', params: SamplingParams(n=1)")
    assert kinds(line) == ["request.received"]


@pytest.mark.parametrize("prompt", [
    "Loading weights took ages, is CUDA graph capture slow?",  # start-up phase words
    "Engine 000: Avg prompt throughput: 9.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs: is that bad?",  # vLLM's stats
    "Decode batch, #running-req: 8, #queue-req: 40, what does it mean?",  # SGLang's stats
])
def test_a_logged_prompt_is_the_prompt_alone(prompt):
    line = (f"(APIServer pid=1) INFO 10-02 11:00:01 [logger.py:43] Received request chatcmpl-1: prompt: '{prompt}', "
            "params: SamplingParams(n=1), prompt_token_ids: None, lora_request: None.")
    assert kinds(line) == ["request.received"]


def test_loadgen_requests_csv_real_header():
    header = ("request_id,worker,profile,scheduled_unix,client_queue_s,outcome,failure_kind,http_status,ttft_s,"
              "tpot_s,e2e_s,end_s,num_chunks,prompt_tokens,output_tokens,output_tokens_source,cached_tokens,"
              "finish_reason,max_tokens,response_id,itl_s,error")
    row = ("loadgen-8e27,local,shared-prefix,1795982244.8252115,1.47e-05,ok,,200,5.056657732000076,"
           "0.07746852799999532,7.458182099999931,7.458420826000065,20,1227,32,usage,0,length,32,"
           "chatcmpl-c457,0.4438762009999664 0.07444315299994742 0.07338203099993734,")
    p = FileParser("loadgen_requests.csv")
    assert p.parse(1, header) == []
    [ev] = p.parse(2, row)
    f = ev.fields
    assert (ev.kind, f["request_id"], f["outcome"]) == ("client.request", "chatcmpl-c457", "ok")
    assert (f["ttft_s"], f["e2e_s"]) == (5.056657732000076, 7.458182099999931)
    assert f["itl_s"] == [0.4438762009999664, 0.07444315299994742, 0.07338203099993734]


ENVOY_JSON = ('{"start_time":"2026-03-04T10:12:45.012Z","method":"POST","path":"/v1/chat/completions",'
              '"protocol":"HTTP/1.1","response_code":504,"response_flags":"UT","bytes_received":412,"bytes_sent":24,'
              '"duration":15001,"upstream_service_time":null,"x_forwarded_for":"10.1.0.4",'
              '"user_agent":"OpenAI/Python 1.51.0","request_id":"5e1c6a57-9a0d-4b56-9c6a-8e0c3c5b2a11",'
              '"authority":"llm.internal","upstream_host":"10.1.3.7:8000"}')


def test_envoy_json_access_log():
    """Envoy's json_format under the names its docs and Istio use: the same access event as its text form."""
    [ev] = FileParser("envoy.log").parse(1, ENVOY_JSON)
    f = ev.fields
    assert (ev.kind, ev.source, f["status"], f["cut"], f["duration_s"], f["upstream_addr"], f["request_id"]) == (
        "http.access", "envoy", 504, "timeout", 15.001, "10.1.3.7:8000", "5e1c6a57-9a0d-4b56-9c6a-8e0c3c5b2a11")
    assert ev.ts.isoformat() == "2026-03-04T10:12:45.012000"
    dc = ENVOY_JSON.replace('"response_code":504', '"response_code":"0"').replace('"UT"', '"DC"')
    assert FileParser("envoy.log").parse(2, dc)[0].fields["cut"] == "client"
    assert FileParser("envoy.log").parse(3, ENVOY_JSON.replace('"response_code":504', '"response_code":"x"')) == []


def test_loadgen_error_text_is_checked_against_the_catalog():
    """The server's message a client logs (vLLM's 400 body) names the cause as if the server had logged it;
    the client's own kind of failure is not repeated by the catalog's client entries."""
    text = ("2026-12-01T22:21:35.695Z ERROR loadgen request_id=loadgen-e3e339ee0bcf44c6 kind=http_status status=400 "
            "elapsed_s=0.082 chunks=0 requests.exceptions.HTTPError: 400 Client Error: Bad Request for url: "
            "http://127.0.0.1:47827/v1/chat/completions (This model's maximum context length is 512 tokens. However, "
            "your prompt contains at least 513 input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt. (parameter=input_tokens, value=513))")
    status, overflow = parse(text)
    assert (status.kind, status.fields["status"]) == ("client.http_status", 400)
    assert (overflow.kind, overflow.fields["max_model_len"], overflow.fields["requested"]) == (
        "context.overflow", "512", "513")
    assert (overflow.fields["request_id"], overflow.source, overflow.text) == ("loadgen-e3e339ee0bcf44c6", "loadgen", text)
    busy = ('{"ts": "2026-12-01T22:05:20.248Z", "level": "ERROR", "logger": "loadgen", "request_id": "r1", '
            '"kind": "error_event", "http_status": 200, "elapsed_s": 0.029, "chunks": 0, "error": "openai.APIError: '
            'The engine is currently busy and cannot accept new requests. Please try again later or on a different '
            'instance."}')
    assert [e.kind for e in parse(busy)] == ["client.error_event", "queue.full"]
    cut = ("2026-11-29T19:40:01.123Z ERROR loadgen request_id=a1 kind=stream_cut status=200 elapsed_s=1.204 "
           "chunks=7 requests.exceptions.ChunkedEncodingError: Response ended prematurely")
    assert [e.kind for e in parse(cut)] == ["client.stream_cut"]


def test_vllm_internal_request_id_is_the_request_it_was_given():
    """vLLM 0.11+ runs a request as '<id>-<8 hex>' (assign_request_id) and logs an abort under both names."""
    from triage.parsers.text_logs import external_request_id
    assert external_request_id("chatcmpl-loadgen-ef5e392b7f144045-9815e3a1") == "chatcmpl-loadgen-ef5e392b7f144045"
    assert external_request_id("chatcmpl-bfa1a19b7f200be3-92964495") == "chatcmpl-bfa1a19b7f200be3"
    for unchanged in ("chatcmpl-bfa1a19b7f200be3", "cmpl-deadbeef", "4f1e2d3c-aaaa-bbbb-cccc-0123456789ab", "r-1-2"):
        assert external_request_id(unchanged) == unchanged
    internal = ("(APIServer pid=25554) INFO 12-01 22:02:40 [async_llm.py:922] Aborted request(s) "
                "chatcmpl-loadgen-ef5e392b7f144045-9815e3a1.")
    given = "(APIServer pid=25554) INFO 12-01 22:02:40 [async_llm.py:783] Request chatcmpl-loadgen-ef5e392b7f144045 aborted."
    assert [e.fields["request_ids"] for line in (internal, given) for e in parse(line)] == [
        ["chatcmpl-loadgen-ef5e392b7f144045"], ["chatcmpl-loadgen-ef5e392b7f144045"]]


def test_one_cancelled_request_counts_once_under_its_client_and_engine_names(tmp_path, diagnose_json):
    """loadgen's 'loadgen-<hex>' is vLLM's 'chatcmpl-loadgen-<hex>' (its X-Request-Id), which vLLM logs twice."""
    (tmp_path / "client.log").write_text("".join(
        f"2026-12-01T22:02:40.{i}00Z INFO loadgen request_id=loadgen-{rid} kind=client_abort status=200 "
        f"elapsed_s=0.299 chunks=3 client cancelled the stream after 3 chunks (abort profile)\n"
        for i, rid in enumerate(("ef5e392b7f144045", "f112ff67551c4ead"))))
    (tmp_path / "engine-0.log").write_text("".join(
        f"(APIServer pid=25554) INFO 12-01 22:02:40 [async_llm.py:922] Aborted request(s) chatcmpl-loadgen-{rid}-{sfx}.\n"
        f"(APIServer pid=25554) INFO 12-01 22:02:40 [async_llm.py:783] Request chatcmpl-loadgen-{rid} aborted.\n"
        for rid, sfx in (("ef5e392b7f144045", "9815e3a1"), ("f112ff67551c4ead", "846b99a7"), ("0134f1e92c3d4ab1", "9ee09d28"))))
    code, doc, err = diagnose_json(str(tmp_path))
    first = doc["findings"][0]
    assert first["id"] == "stream-cut-client-disconnect", err
    assert first["affected_requests"] == {"count": 3, "ids": [
        "chatcmpl-loadgen-0134f1e92c3d4ab1", "loadgen-ef5e392b7f144045", "loadgen-f112ff67551c4ead"]}
