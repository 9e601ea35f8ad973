"""Input files: folders walked recursively, stdin ("-") and pipes, gzip by magic bytes, bad input
skipped with a note."""

import codecs
import ctypes
import gzip
import io
import os
import re
import stat
import sys
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MAX_LINE_BYTES = 1 << 20  # longer lines are cut here (characters once decoded) (a single-huge-line file keeps memory flat)
SNIFF_BYTES = 8192
# the first block small: the parsers read a file's first block line by line (its first lines may be a CSV
# header)
FIRST_BLOCK_BYTES = 1 << 14
BLOCK_BYTES = 1 << 18  # read and scanned at a time: big enough for one scan to do the work, small for flat memory
# A file this small (a paste) is read whole first, and its lines rejoined where a terminal hard-wrapped them
PASTE_BYTES, PASTE_CHARS = 1 << 20, 4 << 20  # (the second: once decoded, for a small gzip file)
MIN_WRAP = 60  # columns: narrower rows of equal width are no terminal's wrapping
_ANSI_CODE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CRLF = re.compile(r"\r\n?")
_TEXT_BYTES = bytes(b for b in range(256) if b >= 0x20 or b in b"\t\n\r\x0b\x0c\x1b")


class InputError(Exception):
    """A path given on the command line that cannot be read at all."""


@dataclass(slots=True)
class Notes:
    """Diagnostics for stderr: one line per problem, never a traceback."""

    lines: list[str] = field(default_factory=list)
    num_files_read: int = 0
    num_lines_read: int = 0
    quiet: dict[str, list[str]] = field(default_factory=dict)  # what, paths: files that hold no log, by design

    def add(self, message: str) -> None:
        if len(self.lines) < 500:
            self.lines.append(message)

    def add_quiet(self, what: str, path: Path) -> None:
        """A file that holds no log and is nothing wrong (a plot, an empty log): one summary line for them all."""
        self.quiet.setdefault(what, []).append(str(path))

    def flush(self, stream=None) -> None:
        for line in self.lines:
            print(f"llmtriage: {line}", file=stream or sys.stderr)
        self.lines.clear()
        if self.quiet:
            parts = [f"{len(paths)} {what}{'s' if len(paths) > 1 else ''} ({_some(paths)})"
                     for what, paths in self.quiet.items()]
            print(f"llmtriage: no log lines in {', '.join(parts)}", file=stream or sys.stderr)
            self.quiet.clear()


def _some(paths: list[str], most: int = 3) -> str:
    names = ", ".join(paths[:most])
    return names if len(paths) <= most else f"{names}, +{len(paths) - most} more"


# Images, by their magic bytes: loadgen's PNG plots and the like sit beside the logs in a report folder.
# They are skipped without a note each (a binary file of another kind is still noted).
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a")


STDIN = Path("-")  # "-" on the command line: standard input (a file named "-" is "./-")


def _kind(path: Path) -> str | None:
    """"file", "dir", "pipe" (a FIFO, or what `<(command)` hands over) or None (missing, or a device)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return "pipe"
    return None


def iter_files(paths: list[str], notes: Notes | None = None) -> Iterator[Path]:
    """Files under each path, folders recursively in sorted order; "-" is stdin, and a pipe named on the
    command line is read as a file. Missing paths raise InputError; a folder that cannot be listed and
    anything in a folder that is not a regular file (a pipe there would block) are noted and skipped."""
    notes = notes if notes is not None else Notes()
    for raw in paths:
        if raw == "-":
            yield STDIN
            continue
        path = Path(raw)
        kind = _kind(path)
        if kind in ("file", "pipe"):
            yield path
        elif kind == "dir":
            for root, dirs, files in os.walk(path, onerror=lambda exc, top=path: notes.add(
                    f"{exc.filename or top}: cannot read folder ({exc.strerror or exc}); skipped")):
                dirs.sort()
                for name in sorted(files):
                    child = Path(root) / name
                    if _kind(child) == "file":
                        yield child
                    elif not child.is_symlink() or child.exists():
                        notes.add(f"{child}: not a regular file; skipped")
        else:
            raise InputError(f"no such file or folder: {raw}")


def _open_binary(path: Path, notes: Notes) -> io.BufferedIOBase | None:
    try:
        if path is STDIN:
            handle = open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115 (closed by read_blocks)
        else:
            handle = open(path, "rb")  # noqa: SIM115 (closed by read_blocks)
    except (OSError, ValueError, AttributeError) as exc:  # ValueError/AttributeError: no stdin to read
        notes.add(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})")
        return None
    try:
        gzipped = handle.peek(2)[:2] == b"\x1f\x8b"
    except OSError as exc:
        notes.add(f"{path}: cannot read ({exc.strerror or exc})")
        handle.close()
        return None
    if gzipped:
        return gzip.GzipFile(fileobj=handle)  # type: ignore[return-value]
    return handle


def _skip_nuls(handle, path: Path, notes: Notes) -> bool:
    """Reads past NUL bytes at the start (what logrotate's copytruncate leaves when the writer keeps its
    offset: the old length as a hole), noting how many. False when nothing but NULs was there."""
    skipped = 0
    while True:
        head = handle.peek(SNIFF_BYTES)[:SNIFF_BYTES]
        if not head:
            break
        run = len(head) - len(head.lstrip(b"\x00"))
        if not run:
            break
        handle.read(run)
        skipped += run
    if skipped:
        notes.add(f"{path}: started with {skipped} NUL bytes (a file truncated while written, as logrotate's "
                  "copytruncate leaves it); skipped them")
    return bool(head)


def _sniff(handle, path: Path, notes: Notes) -> str | None:
    """The text encoding, or None for binary content (noted)."""
    try:
        head = handle.peek(SNIFF_BYTES)[:SNIFF_BYTES] if hasattr(handle, "peek") else b""
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        notes.add(f"{path}: unreadable compressed data ({exc}); skipped")
        return None
    if head.startswith(_IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        notes.add_quiet("image", path)
        return None
    if head[:1] == b"\x00":
        try:
            if not _skip_nuls(handle, path, notes):
                return "utf-8"  # nothing after them: read as an empty file
            head = handle.peek(SNIFF_BYTES)[:SNIFF_BYTES]
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            notes.add(f"{path}: unreadable compressed data ({exc}); skipped")
            return None
        if head.translate(None, _TEXT_BYTES):  # what follows the NULs is no text either
            notes.add(f"{path}: binary content, skipped")
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
    for first, block in read_blocks(path, notes):
        lines = block.split("\n")
        lines.pop()
        yield from enumerate(lines, first + 1)


def read_blocks(path: Path, notes: Notes, lines_in=None) -> Iterator[tuple[int, str]]:
    """(number of lines before the block, block): runs of whole lines, each ending in "\n" (a "\r\n" or
    lone "\r" ending becomes "\n"), about BLOCK_BYTES at a time; never raises for bad content. Blocks are
    not split into lines here: the parsers find the few lines they read in a block by one scan. lines_in:
    the number of lines of a block just handed (a reader that has counted them as it read says so), by
    default counted here."""
    handle = _open_binary(path, notes)
    if handle is None:
        return
    with handle:
        encoding = _sniff(handle, path, notes)
        if encoding is None:
            return
        notes.num_files_read += 1
        if encoding == "utf-16":
            for lineno, line in _read_utf16(handle, path, notes):
                yield lineno - 1, line + "\n"
            return
        if _starts_with_bom(handle):  # (Windows editors save UTF-8 with it: no part of the first line)
            handle.read(len(codecs.BOM_UTF8))
        if _paste_sized(path):
            yield from _read_paste(_read_utf8(handle, path, notes, _count_lines))
            return
        yield from _read_utf8(handle, path, notes, lines_in or _count_lines)


def _paste_sized(path: Path) -> bool:
    """A regular file of at most PASTE_BYTES (stdin and pipes are read in blocks)."""
    if path is STDIN:
        return False
    try:
        info = path.stat()
    except OSError:
        return False  # (the read that follows notes it)
    return stat.S_ISREG(info.st_mode) and info.st_size <= PASTE_BYTES


def _read_paste(blocks: Iterator[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """A small file's blocks, as one block with its hard-wrapped lines rejoined (see unwrap) where it was so
    wrapped, else as they are."""
    read = []
    size = 0
    for item in blocks:
        read.append(item)
        size += len(item[1])
        if size > PASTE_CHARS:  # (a small gzip file of a large log)
            yield from read
            yield from blocks
            return
    text = "".join(block for _, block in read)
    joined = unwrap(text) if text else None
    if joined is None:
        yield from read
    else:
        yield 0, joined


def _visible(row: str) -> str:
    return _ANSI_CODE.sub("", row) if "\x1b" in row else row


def _start(shown: str) -> str:
    """How a row begins, by the class of its first visible character (a digit, a capital, a small letter)
    or the character itself."""
    head = shown[:1]
    return "9" if head.isdigit() else "A" if head.isupper() else "a" if head.islower() else head


def _shape(shown: str) -> str:
    """The kinds of a row's first ten visible characters: each digit a 9, each letter an a, the rest as they are."""
    return shown[:10].translate(_SHAPES)


_SHAPES = str.maketrans("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "9" * 10 + "a" * 52)


def unwrap(text: str) -> str | None:
    """The text's lines rejoined where a terminal hard-wrapped them at a fixed width (a terminal's or
    tmux's capture, a console's copy, journalctl in a narrow window): many rows are of one width, hardly any
    are wider, the rows after them mostly do not begin as the rows after shorter ones do (a record's
    start), and many of those cuts fall inside a word. Each row of that width is joined by the next unless
    the next begins as a record does; the rows joined on are left empty, so a record keeps its first row's
    number. None when the text is not so wrapped."""
    rows = text.split("\n")
    shown = list(map(_visible, rows))
    widths = list(map(len, shown))
    wide = Counter(w for w in widths if w >= MIN_WRAP)
    if not wide:
        return None
    width, num = wide.most_common(1)[0]
    nonblank = sum(map(bool, widths))
    if num < max(3, 0.1 * nonblank) or sum(w > width for w in widths) > max(2, 0.05 * nonblank):
        return None  # (a few wider rows: the user's own words around the paste)
    full = [w == width for w in widths]
    nexts = list(zip(full, shown[1:], strict=False))
    record = Counter(_start(row) for was_full, row in [(False, shown[0]), *nexts] if not was_full and row)
    if not record:
        return None
    start = record.most_common(1)[0][0]
    after = [_start(row) for was_full, row in nexts if was_full and row]
    if not after or after.count(start) > 0.5 * len(after):
        return None
    # a row of full width followed by one whose first characters are of the same kinds, one by one (a
    # time stamp, a prefix): records of one length in a row, not a wrap
    alike = [_shape(shown[k]) == _shape(shown[k + 1]) for k in range(len(rows) - 1) if full[k] and rows[k + 1]]
    if sum(alike) > 0.5 * len(alike):
        return None
    # a terminal cuts where the width ends, often inside a word; fixed-width records (a table, an access
    # log's lines of one length) end and begin with punctuation
    cut = [shown[k][-1:].isalnum() and shown[k + 1][:1].isalnum()
           for k in range(len(rows) - 1) if full[k] and rows[k + 1]]
    if sum(cut) < max(2, 0.25 * len(cut)):
        return None
    out = list(rows)
    first = 0
    for k in range(1, len(rows)):
        if full[k - 1] and rows[k] and _start(shown[k]) != start and out[first]:
            out[first] += rows[k]
            out[k] = ""
        else:
            first = k
    return "\n".join(out)


def _starts_with_bom(handle) -> bool:
    try:
        return handle.peek(len(codecs.BOM_UTF8))[:len(codecs.BOM_UTF8)] == codecs.BOM_UTF8
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
        return False  # (the read that follows notes it)


def keep_freed_blocks() -> bool:
    """Let the C allocator keep the memory of freed blocks for the next ones (glibc only; elsewhere
    nothing). Blocks and what is made of them (the decoded text, its bytes, the columns) are 128 KB and
    more, which glibc maps fresh for each and gives back to the kernel when it is freed: every block then
    costs its pages faulted in again, about a fifth of a second of system time on 256 MB of logs. The
    memory kept is that of blocks already freed, so the peak stays what it was. True when glibc took it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # (not glibc: musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return (mallopt(_M_MMAP_THRESHOLD, 8 << 20) == 1  # blocks from the heap, not mapped one by one
            and mallopt(_M_TRIM_THRESHOLD, 64 << 20) == 1)  # a freed block's memory stays for the next


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # (glibc's malloc.h)


def _count_lines(block: str) -> int:
    return block.count("\n")


def _whole_lines(buf: str, final: bool) -> tuple[str, str]:
    """(whole lines with "\n" endings, the rest); with newline="" semantics a lone "\r" ends a line too."""
    if "\r" not in buf:
        end = len(buf) if final else buf.rfind("\n") + 1
        return buf[:end], buf[end:]
    # a "\r" last in the buffer may be the first half of a "\r\n" still to come
    end = len(buf) if final else max(buf.rfind("\n"), buf.rfind("\r", 0, len(buf) - 1)) + 1
    return _CRLF.sub("\n", buf[:end]), buf[end:]


def _cut_long_lines(block: str) -> tuple[str, bool]:
    """Lines of MAX_LINE_BYTES characters or more are cut there (as readline(MAX_LINE_BYTES) does)."""
    lines = block.split("\n")
    if max(map(len, lines)) < MAX_LINE_BYTES:
        return block, False
    return "\n".join(line[:MAX_LINE_BYTES] for line in lines), True


def _read_utf8(handle, path: Path, notes: Notes, lines_in) -> Iterator[tuple[int, str]]:
    """Blocks of whole lines, each read into one buffer after the part line the last one left and decoded
    once there, up to its last line end; undecodable bytes become U+FFFD and are noted once. A line longer
    than a block, or a read that fails, hands the rest to _read_utf8_lines (its decoder, its care of long
    lines). (Reading into one buffer saves two copies of every block: a fourteenth of a second a 256 MB.)"""
    buf = bytearray(2 * BLOCK_BYTES)
    view = memoryview(buf)
    kept = lineno = 0  # kept: the bytes of a part line at the buffer's start
    bad_encoding = False
    size = FIRST_BLOCK_BYTES
    while True:
        try:
            got = handle.readinto1(view[kept:kept + size])
            size = BLOCK_BYTES
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            yield from _read_utf8_lines(handle, path, notes, lines_in, lineno, bytes(view[:kept]), bad_encoding, exc)
            return
        end = kept + got
        final = not got
        cut = end if final else buf.rfind(b"\n", 0, end) + 1
        if not final and buf.find(b"\r", 0, end) >= 0:  # (a lone "\r" ends a line too; one last may be a "\r\n")
            cut = max(cut, buf.rfind(b"\r", 0, end - 1) + 1)
        if not cut and not final:  # no line end in a block: a long line
            yield from _read_utf8_lines(handle, path, notes, lines_in, lineno, bytes(view[:end]), bad_encoding)
            return
        block = codecs.utf_8_decode(view[:cut], "replace", True)[0]  # (whole lines: no sequence cut in two)
        if "\r" in block:
            block = _CRLF.sub("\n", block)
        if block:
            if not block.endswith("\n"):
                block += "\n"
            if "\ufffd" in block:
                bad_encoding = True
            yield lineno, block
            lineno += lines_in(block)
        if final:
            break
        kept = end - cut
        buf[:kept] = buf[cut:end]
        if kept > BLOCK_BYTES:  # a line as long as a block: read on line by line
            yield from _read_utf8_lines(handle, path, notes, lines_in, lineno, bytes(view[:kept]), bad_encoding)
            return
    _read_notes(path, notes, lineno, bad_encoding, False, False)


def _read_notes(path: Path, notes: Notes, lineno: int, bad_encoding: bool, cut: bool, truncated: bool) -> None:
    notes.num_lines_read += lineno
    if bad_encoding:
        notes.add(f"{path}: not valid UTF-8; undecodable bytes replaced")
    if cut:
        notes.add(f"{path}: lines longer than {MAX_LINE_BYTES} characters were cut")
    if lineno == 0 and not truncated:  # (a truncated file is noted as such, not as empty too)
        notes.add_quiet("empty file", path)


def _read_utf8_lines(handle, path: Path, notes: Notes, lines_in, lineno: int, pending: bytes, bad_encoding: bool,
                     failed: Exception | None = None) -> Iterator[tuple[int, str]]:
    """_read_utf8 from line lineno on, pending the bytes read after it (failed: how the read after them
    failed), decoded incrementally: a line of MAX_LINE_BYTES characters or more is cut there."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    carry = decoder.decode(pending, False)
    skipping = cut = truncated = False  # skipping: the rest of a line already cut
    while True:
        try:
            if failed is not None:
                raise failed  # (read as any failed read)
            raw = handle.read1(BLOCK_BYTES)
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            block, _ = _whole_lines(carry, False)
            if block:
                yield lineno, block
                lineno += lines_in(block)
            notes.add(f"{path}: truncated or corrupt after line {lineno} ({exc or 'unexpected end'})")
            truncated = True
            break
        final = not raw
        buf = carry + decoder.decode(raw, final)
        if skipping:
            at = buf.find("\n")
            if at < 0:
                buf = ""
            else:
                buf, skipping = buf[at + 1:], False
        block, carry = _whole_lines(buf, final)
        if block and not block.endswith("\n"):
            block += "\n"
        if len(carry) >= MAX_LINE_BYTES:  # no line end in sight: cut the line, skip the rest of it
            block += carry[:MAX_LINE_BYTES] + "\n"
            carry, skipping, cut = "", True, True
        if len(block) > MAX_LINE_BYTES:
            block, was_cut = _cut_long_lines(block)
            cut = cut or was_cut
        if block:
            if "\ufffd" in block:
                bad_encoding = True
            yield lineno, block
            lineno += lines_in(block)
        if final:
            break
    _read_notes(path, notes, lineno, bad_encoding, cut, truncated)


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
