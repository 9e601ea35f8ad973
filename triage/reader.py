"""Input files: folders walked recursively, gzip by magic bytes, bad input skipped with a note."""

import gzip
import io
import os
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MAX_LINE_BYTES = 1 << 20  # longer lines are cut here (characters once decoded) (a single-huge-line file keeps memory flat)
SNIFF_BYTES = 8192


class InputError(Exception):
    """A path given on the command line that cannot be read at all."""


@dataclass(slots=True)
class Notes:
    """Diagnostics for stderr: one line per problem, never a traceback."""

    lines: list[str] = field(default_factory=list)
    num_files_read: int = 0
    num_lines_read: int = 0

    def add(self, message: str) -> None:
        if len(self.lines) < 500:
            self.lines.append(message)

    def flush(self, stream=None) -> None:
        for line in self.lines:
            print(f"llmtriage: {line}", file=stream or sys.stderr)
        self.lines.clear()


def iter_files(paths: list[str]) -> Iterator[Path]:
    """Files under each path, folders recursively in sorted order; missing paths raise InputError."""
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            yield path
        elif path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for name in sorted(files):
                    yield Path(root) / name
        else:
            raise InputError(f"no such file or folder: {raw}")


def _open_binary(path: Path, notes: Notes) -> io.BufferedIOBase | None:
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed by read_lines)
    except OSError as exc:
        notes.add(f"{path}: cannot read ({exc.strerror or exc})")
        return None
    if handle.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=handle)  # type: ignore[return-value]
    return handle


def _sniff(handle, path: Path, notes: Notes) -> str | None:
    """The text encoding, or None for binary content (noted)."""
    try:
        head = handle.peek(SNIFF_BYTES)[:SNIFF_BYTES] if hasattr(handle, "peek") else b""
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        notes.add(f"{path}: unreadable compressed data ({exc}); skipped")
        return None
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        notes.add(f"{path}: UTF-16 text, decoded as such")
        return "utf-16"
    if b"\x00" in head:
        notes.add(f"{path}: binary content, skipped")
        return None
    return "utf-8"


def read_lines(path: Path, notes: Notes) -> Iterator[tuple[int, str]]:
    """(line number, text) pairs, streamed; never raises for bad content."""
    handle = _open_binary(path, notes)
    if handle is None:
        return
    with handle:
        encoding = _sniff(handle, path, notes)
        if encoding is None:
            return
        notes.num_files_read += 1
        if encoding == "utf-16":
            yield from _read_utf16(handle, path, notes)
            return
        yield from _read_utf8(handle, path, notes)


def _read_utf8(handle, path: Path, notes: Notes) -> Iterator[tuple[int, str]]:
    """Decoding in C through TextIOWrapper; undecodable bytes become U+FFFD and are noted once."""
    text = io.TextIOWrapper(handle, encoding="utf-8", errors="replace", newline="")
    readline = text.readline
    lineno = 0
    bad_encoding = cut = False
    while True:
        try:
            line = readline(MAX_LINE_BYTES)
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            notes.add(f"{path}: truncated or corrupt after line {lineno} ({exc or 'unexpected end'})")
            break
        if not line:
            break
        lineno += 1
        if len(line) >= MAX_LINE_BYTES and not line.endswith("\n"):
            cut = True
            _skip_rest_of_line(readline)
        if "\ufffd" in line:
            bad_encoding = True
        yield lineno, line.rstrip("\r\n")
    text.detach()
    notes.num_lines_read += lineno
    if bad_encoding:
        notes.add(f"{path}: not valid UTF-8; undecodable bytes replaced")
    if cut:
        notes.add(f"{path}: lines longer than {MAX_LINE_BYTES} characters were cut")
    if lineno == 0:
        notes.add(f"{path}: empty")


def _skip_rest_of_line(readline) -> None:
    while True:
        try:
            chunk = readline(MAX_LINE_BYTES)
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
            return
        if not chunk or chunk.endswith("\n"):
            return


def _read_utf16(handle, path: Path, notes: Notes) -> Iterator[tuple[int, str]]:
    text = io.TextIOWrapper(handle, encoding="utf-16", errors="replace")
    lineno = 0
    try:
        while True:
            line = text.readline(MAX_LINE_BYTES)
            if not line:
                break
            lineno += 1
            yield lineno, line.rstrip("\r\n")
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile, UnicodeError) as exc:
        notes.add(f"{path}: truncated or corrupt after line {lineno} ({exc})")
    notes.num_lines_read += lineno
