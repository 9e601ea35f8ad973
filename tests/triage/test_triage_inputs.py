"""What llmtriage reads besides plain files: a log that starts with NUL bytes, stdin, pipes; and what it
notes instead of skipping silently (a folder it cannot list, a pipe inside a folder)."""

import gzip
import os
import subprocess
import sys
import threading
from pathlib import Path

from triage.reader import Notes, read_lines

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_LINE = ('2024/05/01 12:00:00 [error] 31#31: *1 upstream timed out (110: Connection timed out) while '
                'reading upstream, client: 1.2.3.4, server: _, request: "POST /v1/chat/completions HTTP/1.1"')
LOG = (TIMEOUT_LINE + "\n").encode() * 3


def _cli(*args: str, stdin: bytes | None = None, shell: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = ["bash", "-c", shell] if shell else [sys.executable, "-m", "triage.cli", *args]
    return subprocess.run(argv, input=stdin, capture_output=True, env=env, cwd=ROOT, timeout=120)


def test_leading_nul_bytes_are_skipped_and_counted(tmp_path, diagnose_json):
    path = tmp_path / "error.log"
    path.write_bytes(b"\x00" * 100_000 + LOG)  # logrotate copytruncate: the old length as a hole
    code, doc, err = diagnose_json(path)
    assert code == 1 and doc["findings"][0]["id"] == "stream-cut-gateway-timeout"
    assert f"llmtriage: {path}: started with 100000 NUL bytes" in err and "binary content" not in err
    assert [e["line"] for e in doc["findings"][0]["evidence"]] == [1]  # the NULs hold no line
    assert list(read_lines(path, Notes())) == [(i, TIMEOUT_LINE) for i in (1, 2, 3)]


def test_leading_nuls_in_gzip_and_nuls_alone(tmp_path):
    gz = tmp_path / "error.log.1.gz"
    gz.write_bytes(gzip.compress(b"\x00" * 20_000 + LOG))
    notes = Notes()
    assert len(list(read_lines(gz, notes))) == 3 and "started with 20000 NUL bytes" in notes.lines[0]
    hole = tmp_path / "just-truncated.log"
    hole.write_bytes(b"\x00" * 5000)
    notes = Notes()
    assert list(read_lines(hole, notes)) == []
    assert [n.split(": ", 1)[1] for n in notes.lines] == [
        "started with 5000 NUL bytes (a file truncated while written, as logrotate's copytruncate leaves it); "
        "skipped them"]
    assert notes.quiet == {"empty file": [str(hole)]}


def test_a_utf8_byte_order_mark_is_no_part_of_the_first_line(tmp_path, diagnose_json):
    """Windows editors save UTF-8 with a byte order mark: the first line reads as without it."""
    access = (b'10.0.0.7 - - [09/May/2025:10:13:33 +0000] "POST /v1/chat/completions HTTP/1.1" 504 167 "-" '
              b'"OpenAI/Python 1.51.0"\n')
    for name, data in (("access.log", b"\xef\xbb\xbf" + access), ("access.log.1.gz", gzip.compress(b"\xef\xbb\xbf" + access))):
        path = tmp_path / name
        path.write_bytes(data)
        assert list(read_lines(path, Notes())) == [(1, access.decode().rstrip("\n"))]
        code, doc, err = diagnose_json(path)
        assert code == 1 and doc["findings"][0]["id"] == "stream-cut-gateway-timeout", err


def test_nul_then_binary_is_still_binary(tmp_path):
    path = tmp_path / "core"
    path.write_bytes(b"\x00\x01\x02\x03" * 100)
    notes = Notes()
    assert list(read_lines(path, notes)) == [] and notes.lines[-1].endswith("binary content, skipped")


def test_stdin_dash_is_read():
    proc = _cli("diagnose", "-", "--format", "json", stdin=LOG)
    assert proc.returncode == 1, proc.stderr
    assert b'"id": "stream-cut-gateway-timeout"' in proc.stdout and b'"file": "-"' in proc.stdout


def test_process_substitution_pipe_is_read(tmp_path):
    (tmp_path / "error.log").write_bytes(LOG)
    proc = _cli(shell=f"exec {sys.executable} -m triage.cli diagnose <(cat {tmp_path / 'error.log'}) --format json")
    assert proc.returncode == 1, proc.stderr
    assert b'"id": "stream-cut-gateway-timeout"' in proc.stdout and b"no such file" not in proc.stderr


def test_named_fifo_is_read(tmp_path, diagnose_json):
    fifo = tmp_path / "kubectl-logs"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(LOG,))
    writer.start()
    code, doc, err = diagnose_json(fifo)
    writer.join()
    assert code == 1 and doc["findings"][0]["id"] == "stream-cut-gateway-timeout"


def test_fifo_inside_a_folder_is_noted_not_read(tmp_path, diagnose_json):
    (tmp_path / "error.log").write_bytes(LOG)
    os.mkfifo(tmp_path / "pipe")  # opening it would wait for a writer forever
    code, doc, err = diagnose_json(tmp_path)
    assert code == 1 and f"llmtriage: {tmp_path / 'pipe'}: not a regular file; skipped" in err


def test_unreadable_subfolder_is_noted(tmp_path, diagnose_json, monkeypatch):
    (tmp_path / "error.log").write_bytes(LOG)
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "engine.log").write_bytes(LOG)
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):  # root reads any folder: the refusal it would get comes from scandir
            real = os.scandir

            def scandir(path="."):
                if Path(path) == locked:
                    raise PermissionError(13, "Permission denied", str(locked))
                return real(path)

            monkeypatch.setattr(os, "scandir", scandir)
        code, doc, err = diagnose_json(tmp_path)
    finally:
        locked.chmod(0o755)
    assert code == 1 and f"llmtriage: {locked}: cannot read folder (Permission denied); skipped" in err
