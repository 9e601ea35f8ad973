"""Bad input never produces a traceback: skipped or read with a one-line note; parsers fuzzed."""

import gzip
import json
import string
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triage.parsers import FileParser
from triage.reader import MAX_LINE_BYTES, Notes, read_lines

TIMEOUT_LINE = ('2024/05/01 12:00:00 [error] 31#31: *1 upstream timed out (110: Connection timed out) while '
                'reading upstream, client: 1.2.3.4, server: _, request: "POST /v1/chat/completions HTTP/1.1"')
SEEDS = [
    TIMEOUT_LINE,
    '127.0.0.1 - - [29/Nov/2026:19:40:01 +0000] "POST /v1/chat/completions HTTP/1.1" 499 0 "-" "ua" 1 2.0',
    '{"ts":"2026-11-29T19:40:01.123Z","level":"info","event":"request.finished","prefix_fingerprint":["a"]}',
    "(EngineCore_DP0 pid=1) ERROR 03-03 19:38:29 [core.py:708] torch.OutOfMemoryError: CUDA out of memory.",
    "INFO 05-21 21:11:56 [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 tokens/s, Running: 8 reqs",
    '[2026-03-04T10:12:45.012Z] "POST /v1 HTTP/1.1" 504 UT 1 2 3 - "a" "b" "c" "d" "e"',
    "# TYPE llm_preemptions_total counter", 'llm_preemptions_total{model="m"} 5',
    "| NVIDIA-SMI 470.182.03   Driver Version: 470.182.03   CUDA Version: 11.4     |",
    "request_id,ttft_ms,e2e_ms",
    "slot get_availabl: id  0 | task 412 | selected slot by lcs similarity, lcs_len = 3934, similarity = 0.972078",
    "slot update_slots: id  0 | task 510 | kv cache rm [17, end)",
    "[2026-09-03 08:15:20 DP0] Avg thr (in/out): 8120.4 / 377.9 tokens/s, Engine (running/waiting): 12 / 0, "
    "KV cache: 14.6%, Prefix cache hit rate: 35.0%, ",
    "      Started:      Wed, 02 Jul 2025 11:02:44 +0000", "      Finished:     Wed, 02 Jul 2025 20:41:09 +0000",
    '            "StartedAt": "2024-10-21T05:00:11.123456789Z",', '        finishedAt: "2025-08-14T17:26:52Z"',
    "[2025-10-03 12:04:14,877] INFO: Routing request 7b3e with session id None to http://10.1.4.22:8000 at 1.0",
    "[2025-03-03 16:41:05] Receive: obj=GenerateReqInput(text='<|im_start|>system\\n[trace_id=77 ts=1.9]', "
    "input_ids=None, rid='975')",
    "< HTTP/2 524",
    '{"level":50,"time":1743582677421,"err":{"type":"E","message":"422 Input validation error"},"msg":"failed"}',
]


@st.composite
def mutated_line(draw):
    seed = draw(st.sampled_from(SEEDS))
    cut = draw(st.integers(0, len(seed)))
    junk = draw(st.text(alphabet=string.printable + "{}[]\"'\\é☃\x00", max_size=40))
    mode = draw(st.integers(0, 3))
    if mode == 0:
        return seed[:cut]
    if mode == 1:
        return seed[:cut] + junk + seed[cut:]
    if mode == 2:
        return junk
    return seed.replace(seed[cut:cut + 1], junk[:3]) if seed[cut:cut + 1] else seed + junk


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated_line(), min_size=1, max_size=6))
def test_fuzz_parsers_never_raise(lines):
    parser = FileParser("fuzz.log")
    for i, line in enumerate(lines, 1):
        for ev in parser.parse(i, line):
            assert ev.line == i and ev.file == "fuzz.log" and isinstance(ev.fields, dict)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_arbitrary_text(text):
    parser = FileParser("fuzz.log")
    for i, line in enumerate(text.split("\n"), 1):
        parser.parse(i, line)


def test_binary_empty_truncated_gzip_latin1_huge(tmp_path, run_cli):
    (tmp_path / "core.bin").write_bytes(b"\x7fELF\x00\x01\x02" * 100)
    (tmp_path / "empty.log").write_bytes(b"")
    whole = gzip.compress((TIMEOUT_LINE + "\n").encode() * 50)
    (tmp_path / "cut.log.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "latin1.log").write_bytes(b"caf\xe9 " + TIMEOUT_LINE.encode() + b"\n")
    (tmp_path / "huge.log").write_bytes(b"x" * (MAX_LINE_BYTES * 2 + 10) + b"\n" + TIMEOUT_LINE.encode() + b"\n")
    code, out, err = run_cli("diagnose", tmp_path, "--format", "json")
    assert code == 1 and "Traceback" not in err and "Traceback" not in out
    notes = err.strip().splitlines()
    assert any("core.bin: binary content, skipped" in n for n in notes)
    assert any(n.startswith("llmtriage: no log lines in 1 empty file (") and "empty.log)" in n for n in notes)
    assert any("cut.log.gz: truncated or corrupt" in n for n in notes)
    assert any("latin1.log: not valid UTF-8; undecodable bytes replaced" in n for n in notes)
    assert any("huge.log: lines longer than" in n for n in notes)
    assert all(n.startswith("llmtriage: ") for n in notes)


def test_utf16_file_is_read(tmp_path):
    path = tmp_path / "win.log"
    path.write_bytes((TIMEOUT_LINE + "\r\n").encode("utf-16"))
    notes = Notes()
    lines = list(read_lines(path, notes))
    assert lines == [(1, TIMEOUT_LINE)] and any("UTF-16" in n for n in notes.lines)


def test_gzip_is_recognised_by_content_not_name(tmp_path):
    path = tmp_path / "no-extension"
    path.write_bytes(gzip.compress(b"line one\nline two\n"))
    assert list(read_lines(path, Notes())) == [(1, "line one"), (2, "line two")]


def test_huge_line_memory_is_bounded(tmp_path):
    path = tmp_path / "one-line.log"
    path.write_bytes(b"a" * (MAX_LINE_BYTES * 3))
    [(lineno, text)] = list(read_lines(path, Notes()))
    assert lineno == 1 and len(text) == MAX_LINE_BYTES


def test_only_unreadable_input_exits_2(tmp_path, run_cli):
    (tmp_path / "a.bin").write_bytes(b"\x00\x01\x02")
    code, out, err = run_cli("diagnose", tmp_path)
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1] == "llmtriage: nothing readable in the given paths"
    (tmp_path / "empty.log").write_bytes(b"")  # empty and truncated files hold no line either: not "ok"
    (tmp_path / "cut.log.gz").write_bytes(gzip.compress(b"no line end yet")[:12])
    code, out, err = run_cli("diagnose", tmp_path, "--format", "json")
    assert code == 2 and out == "" and err.strip().splitlines()[-1] == "llmtriage: nothing readable in the given paths"
    assert f"{tmp_path / 'cut.log.gz'}: truncated or corrupt after line 0" in err  # truncated, not also empty
    assert f"llmtriage: no log lines in 1 empty file ({tmp_path / 'empty.log'})\n" in err  # truncated, not also empty


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=4000))
def test_fuzz_reader_on_random_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "blob"
    path.write_bytes(data)
    parser = FileParser(str(path))
    for lineno, line in read_lines(path, Notes()):
        parser.parse(lineno, line)


def test_deeply_nested_json_line_is_skipped():
    assert FileParser("x.log").parse(1, '{"a":' + "[" * 100_000) == []


def test_images_and_empty_files_make_one_quiet_line(tmp_path, run_cli):
    """loadgen's plots beside the logs and an empty client log are no log and nothing wrong: one line names
    them all; a binary file of another kind keeps its own note."""
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01"
    for name in ("loadgen_latency.png", "loadgen_throughput.png", "loadgen_concurrency.png", "loadgen_ttft.png"):
        (tmp_path / name).write_bytes(png)
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00")
    (tmp_path / "client.log").write_bytes(b"")
    (tmp_path / "core.bin").write_bytes(b"\x7fELF\x00\x01\x02" * 100)
    (tmp_path / "engine.log").write_text(TIMEOUT_LINE + "\n")
    code, out, err = run_cli("diagnose", tmp_path)
    assert code == 1
    assert err.splitlines() == [
        f"llmtriage: {tmp_path / 'core.bin'}: binary content, skipped",
        f"llmtriage: no log lines in 1 empty file ({tmp_path / 'client.log'}), 5 images ("
        f"{tmp_path / 'loadgen_concurrency.png'}, {tmp_path / 'loadgen_latency.png'}, "
        f"{tmp_path / 'loadgen_throughput.png'}, +2 more)"]


# JSON values of every type (and numbers at the edges) for the fields of JSON log lines: the rules read an
# engine event's fields as its line decoded them, so a field of an unexpected type must cost nothing
ODD_VALUES = (None, True, -1, 1e308, 10**30, "x", "", [], {}, [[1], [2], [3]], [{"a": 1}, {"b": 2}], [None, None])


# JSON access lines of the gateways (Envoy's, nginx's escape=json, Cloudflare's Logpush), served and failed
GATEWAY_JSON = {
    "envoy": '{"start_time":"2026-03-04T10:12:45.012Z","method":"POST","path":"/v1/chat/completions",'
             '"protocol":"HTTP/1.1","response_code":504,"response_flags":"UT","bytes_received":412,"bytes_sent":24,'
             '"duration":15001,"upstream_service_time":null,"x_forwarded_for":"10.1.0.4","request_id":"5e1c6a57",'
             '"downstream_remote_address":"10.1.0.4:51234","upstream_host":"10.1.3.7:8000"}',
    "envoy-served": '{"start_time":"2026-03-04T10:12:46.012Z","method":"POST","path":"/v1/chat/completions",'
                    '"response_code":200,"response_flags":"-","duration":812,"upstream_host":"10.1.3.8:8000",'
                    '"downstream_remote_address":"10.1.0.5:51235"}',
    "nginx-json": '{"time_iso8601":"2026-11-29T19:40:01+00:00","remote_addr":"10.0.0.7","request_method":"POST",'
                  '"request_uri":"/v1/chat/completions","status":504,"request_time":60.001,'
                  '"upstream_response_time":"60.000","upstream_addr":"10.0.0.12:8000","request_id":"a1",'
                  '"http_user_agent":"OpenAI/Python 1.51.0","body_bytes_sent":"0"}',
    "cloudflare": '{"ClientIP":"203.0.113.9","ClientRequestMethod":"POST","ClientRequestURI":"/v1/chat/completions",'
                  '"EdgeResponseStatus":524,"EdgeStartTimestamp":"2026-11-29T19:40:01Z",'
                  '"EdgeEndTimestamp":"2026-11-29T19:41:41Z","OriginIP":"198.51.100.4","OriginResponseStatus":0,'
                  '"RayID":"8c1f2e3d4c5b6a79","ClientRequestUserAgent":"curl/8.5.0","EdgeResponseBytes":1024}',
}


def _json_lines_of_each_kind() -> dict[str, str]:
    """One engine JSON line of each event kind, from this suite's corpus, and the gateways' JSON lines."""
    lines: dict[str, str] = {}
    for path in sorted(Path(__file__).parent.glob("corpus/*/engine-0.log")):
        for line in path.read_text().splitlines():
            if line.startswith("{") and (kind := json.loads(line).get("event")) not in lines:
                lines[kind] = line
    return {**lines, **GATEWAY_JSON}


def test_json_fields_of_any_type_never_raise(tmp_path, run_cli):
    samples = _json_lines_of_each_kind()
    assert {"request.finished", "request.scheduled", "engine.stats", "http.access", "engine.error"} <= set(samples)
    for i, value in enumerate(ODD_VALUES):
        lines = []
        for line in samples.values():
            obj = json.loads(line)
            for key in obj:
                if key not in ("event", "logger"):
                    lines += [json.dumps({**obj, key: value})] * 20  # (20 in a row: read in bulk too)
        text = json.dumps(value).replace(" ", "")  # (the --log-format text form: key=value)
        lines += [f"2026-11-29T19:40:{10 + k:02d}.000Z INFO    engine.stats running={text} waiting={text} "
                  f"kv_usage={text} prefix_hit_rate={text} preemptions={text}" for k in range(20)]
        lines.append(f"2026-11-29T19:41:00.000Z INFO    engine.startup block_size={text} num_blocks={text}")
        (tmp_path / f"engine-{i}.log").write_text("\n".join(lines) + "\n")
        code, out, err = run_cli("diagnose", tmp_path / f"engine-{i}.log", "--format", "json")
        assert code in (0, 1) and "Traceback" not in err, (value, err)
        assert json.loads(out)["findings"] is not None
        code, out, err = run_cli("diagnose", tmp_path / f"engine-{i}.log")
        assert code in (0, 1) and "Traceback" not in err and out.strip(), (value, err)
