"""Pastes hard-wrapped by a terminal (tmux's capture, a console's copy, journalctl in a narrow window): their
rows are rejoined before reading, each record at its first row's number; files that are not wrapped, tables
and fixed-width records among them, are read as they are."""

import pytest

from triage import reader
from triage.reader import Notes, read_blocks, unwrap

# Ollama's runner (runner/llamarunner/runner.go): slog.Warn("truncating input prompt", "limit", ...)
OLLAMA = [
    'Jul 14 09:31:02 ai-box ollama[1187]: time=2025-07-14T09:31:02.012+02:00 level=INFO source=server.go:135 '
    'msg="system memory" total="62.7 GiB" free="55.1 GiB" free_swap="8.0 GiB"',
    'Jul 14 09:31:02 ai-box ollama[1187]: time=2025-07-14T09:31:02.104+02:00 level=INFO source=server.go:598 '
    'msg="waiting for llama runner to start responding"',
    'Jul 14 09:31:04 ai-box ollama[1187]: time=2025-07-14T09:31:04.368+02:00 level=INFO source=server.go:637 '
    'msg="llama runner started in 2.26 seconds"',
    'Jul 14 09:31:04 ai-box ollama[1187]: time=2025-07-14T09:31:04.402+02:00 level=WARN source=runner.go:128 '
    'msg="truncating input prompt" limit=4096 prompt=11237 keep=4 new=4096',
    'Jul 14 09:31:19 ai-box ollama[1187]: [GIN] 2025/07/14 - 09:31:19 | 200 | 17.902345112s |       127.0.0.1 | '
    'POST     "/api/chat"',
]
# vLLM V1 (v1/core/kv_cache_utils.py), behind its coloured process prefix as tmux capture-pane -e keeps it
PREFIX = "\x1b[1;36m(EngineCore_0 pid=2391)\x1b[0;0m "
VLLM = [
    PREFIX + "INFO 08-21 14:03:29 [gpu_model_runner.py:2007] Model loading took 61.0347 GiB and 20.116483 seconds",
    PREFIX + "INFO 08-21 14:04:35 [gpu_worker.py:276] Available KV cache memory: 8.47 GiB",
    PREFIX + "ERROR 08-21 14:04:35 [core.py:700] EngineCore failed to start.",
    PREFIX + "ERROR 08-21 14:04:35 [core.py:700] ValueError: To serve at least one request with the models's max "
    "seq len (131072), (32.00 GiB KV cache is needed, which is larger than the available KV cache memory (8.47 "
    "GiB). Based on the available memory, the estimated maximum model length is 34688. Try increasing "
    "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
]


def _wrap(lines: list[str], width: int) -> str:
    """As a terminal of `width` columns shows them (escape codes take no column)."""
    rows = []
    for line in lines:
        shown = reader._visible(line)
        skip = len(line) - len(shown)  # (the escape codes lead the line here)
        rows.append(line[:skip + width])
        rows += [shown[k:k + width] for k in range(width, len(shown), width)]
    return "\n".join(rows) + "\n"


def test_wrapped_rows_are_rejoined_at_the_first_rows_number():
    text = _wrap(OLLAMA, 120)
    joined = unwrap(text)
    rows = joined.split("\n")
    assert len(rows) == len(text.split("\n"))  # every record keeps its first row's number
    assert [row for row in rows if row] == OLLAMA
    assert rows[0] == OLLAMA[0] and rows[1] == ""


@pytest.mark.parametrize("lines, width, finding", [(OLLAMA, 120, "context-overflow"),
                                                   (VLLM, 100, "oom-kv-capacity")], ids=["journalctl", "tmux-ansi"])
def test_a_wrapped_paste_is_diagnosed_as_the_whole_lines_are(lines, width, finding, tmp_path, diagnose_json):
    (tmp_path / "paste.log").write_text(_wrap(lines, width))
    code, doc, err = diagnose_json(str(tmp_path))
    assert code == 1, err
    assert doc["findings"][0]["id"] == finding
    (tmp_path / "paste.log").write_text("\n".join(lines) + "\n")
    assert diagnose_json(str(tmp_path))[1]["findings"][0]["id"] == finding


def test_the_decisive_record_is_quoted_at_its_first_row(tmp_path, diagnose_json):
    text = _wrap(OLLAMA, 120)
    (tmp_path / "paste.log").write_text(text)
    _, doc, _ = diagnose_json(str(tmp_path))
    evidence = doc["findings"][0]["evidence"][0]
    first_row = next(k for k, row in enumerate(text.split("\n"), 1) if "level=WARN" in row)
    assert evidence["line"] == first_row
    assert evidence["text"] == OLLAMA[3]


GIN = ['[GIN] 2025/01/15 - 10:22:31 | 503 |      92.311µs |       10.1.4.22 | POST     "/v1/chat/completions"'] * 8
SMI = ["+-----------------------------------------------------------------------------+",
       "| NVIDIA-SMI 470.182.03   Driver Version: 470.182.03   CUDA Version: 11.4     |",
       "|-------------------------------+----------------------+----------------------+",
       "|   0  NVIDIA A100-SXM...  On   | 00000000:07:00.0 Off |                    0 |",
       "+-------------------------------+----------------------+----------------------+"]
# TGI's router refusing requests (tokio's "no permits available"): lines of one width after its indented Args
TGI = ['2026-01-27T15:02:44.019832Z  INFO text_generation_launcher: Args {', '    model_id: "Qwen/Qwen2.5-7B-Instruct",',
       "    max_concurrent_requests: 128,", "    ...", "}"] + [
    f'2026-01-27T15:31:1{k}.228194Z ERROR chat_completions{{total_time="0.000{k}s"}}: text_generation_router::infer: '
    "router/src/infer/mod.rs:118: no permits available" for k in range(4)]
HTTPX = ['INFO:httpx:HTTP Request: POST http://10.0.0.8:8000/v1/chat/completions "HTTP/1.1 200 OK"',
         "[1/8] 1.82s  prompt_tokens=58 completion_tokens=87  finish_reason=stop"] * 4


@pytest.mark.parametrize("lines", [
    GIN + ['time=2025-01-15T10:22:31.001Z level=INFO source=sched.go:1 msg="x"'] * 2,  # records of one width
    SMI + ["$ python -c 'import torch'"],  # a table
    HTTPX,  # records of one width, each followed by another kind of line
    TGI,  # records of one width in a row, each ending in a word, after lines that begin otherwise
    OLLAMA,  # not wrapped at all
], ids=["fixed-width-records", "table", "alternating-records", "records-after-other-lines", "plain"])
def test_files_that_are_not_wrapped_are_left_alone(lines):
    assert unwrap("\n".join(lines) + "\n") is None


def test_only_small_files_are_read_whole(tmp_path, monkeypatch):
    path = tmp_path / "paste.log"
    text = _wrap(OLLAMA, 120)
    path.write_text(text)
    assert "".join(block for _, block in read_blocks(path, Notes())) == unwrap(text)
    monkeypatch.setattr(reader, "PASTE_BYTES", len(text) - 1)
    assert "".join(block for _, block in read_blocks(path, Notes())) == text
