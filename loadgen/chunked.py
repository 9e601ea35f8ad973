"""A streamed response's chunked body, read straight off its connection as the bytes arrive.

requests' `iter_content` walks urllib3's and http.client's chunk reader for every SSE event: a
readline for the chunk size, a read for the data, a read for its CRLF, each through several layers
and a context manager; that was most of the client's CPU per token. Here one `read1` on the
connection's buffered socket returns whatever has arrived (it waits only while nothing has, never
for a buffer to fill), and the chunked framing is undone with bytes operations. Errors are raised
as requests' `iter_content` raises them (ChunkedEncodingError, ConnectionError for a read timeout),
so failures read and classify the same; a completed body hands the connection back to the pool for
keep-alive, a broken or abandoned one closes it.

`ChunkedBody.open(resp)` returns None where the fast path does not apply (not chunked, compressed,
partly read, not http.client underneath): `read1_chunks(resp)` then reads such a body through
urllib3's `read1` (what has arrived, decompressed), again with requests' exceptions.
"""

import http.client
import time
from collections.abc import Callable

import requests
from gevent import Timeout
from urllib3.exceptions import DecodeError, InvalidChunkLength, ProtocolError, ReadTimeoutError, SSLError

READ_SIZE = 16384  # at most this much per read; a read returns what has arrived, however little
MAX_LINE = 65536  # a chunk-size or trailer line longer than this is a broken stream (http.client's limit)


class ChunkedBody:
    __slots__ = ("resp", "raw", "hr", "fp", "clock", "arrived", "done", "_left", "_crlf", "_line", "_trailer",
                 "_extra", "_gsock", "_primed", "_watchdog", "_last")

    def __init__(self, resp, raw, hr, fp, clock: Callable[[], float] = time.perf_counter) -> None:
        self.resp = resp  # requests.Response (Locust's ResponseContextManager)
        self.raw = raw  # urllib3.HTTPResponse
        self.hr = hr  # http.client.HTTPResponse
        self.fp = fp  # the connection's io.BufferedReader
        self.clock = clock
        self.arrived = 0.0  # clock() as the last read returned: when its bytes arrived
        self.done = False  # the last chunk and the trailer were read
        self._left = 0  # data bytes of the current chunk still to come
        self._crlf = 0  # bytes of the CRLF after a chunk's data still to skip
        self._line = b""  # a size or trailer line not complete yet
        self._trailer = False  # past the zero-size chunk: trailer lines until a blank one
        self._extra = False  # bytes after the end of the body: the connection is not reusable
        self._gsock = None  # under gevent: the connection's socket, to wait on before each read
        self._primed = False  # the first read took what http.client had buffered after the headers
        self._watchdog = None  # gevent.Timeout: fires when the read timeout may have run out
        self._last = time.monotonic()  # when the last read returned, for the read timeout

    @classmethod
    def open(cls, resp, clock: Callable[[], float] = time.perf_counter) -> "ChunkedBody | None":
        raw = getattr(resp, "raw", None)
        hr = getattr(raw, "_fp", None)
        if not isinstance(hr, http.client.HTTPResponse) or not hr.chunked or hr.chunk_left is not None:
            return None
        fp = hr.fp
        if fp is None or not hasattr(fp, "read1") or getattr(raw, "_fp_bytes_read", 0):
            return None
        if raw.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
            return None
        body = cls(resp, raw, hr, fp, clock)
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        if all(hasattr(sock, name) for name in ("_wait", "_read_event", "_sock", "timeout")):
            body._gsock = sock  # a gevent socket (Locust monkey-patches): see _gevent_read
        return body

    def read(self) -> bytes:
        """Body bytes that have arrived, waiting only while there are none; b"" once the body is complete.

        One socket read per call, timed in `arrived` as it returns; a read that brought only framing
        (a chunk-size line, a CRLF) returns b"" with `done` still False, and the caller reads again."""
        if self.done:
            return b""
        try:
            if self._primed:
                data = self._gevent_read()
            else:
                data = self.fp.read1(READ_SIZE)
                self._primed = self._gsock is not None
            self.arrived = self.clock()
            self._last = time.monotonic()
        except TimeoutError as exc:  # socket.timeout
            self._abandon()
            raise requests.exceptions.ConnectionError(
                ReadTimeoutError(getattr(self.raw, "_pool", None), None, "Read timed out.")) from exc
        except OSError as exc:
            self._abandon()
            raise requests.exceptions.ChunkedEncodingError(ProtocolError(f"Connection broken: {exc!r}", exc)) from exc
        if not data:
            return self._eof()
        try:
            body = self._decode(data)
        except requests.exceptions.RequestException:
            self._abandon()
            raise
        if self.done:
            self._finish()
        return body

    def _gevent_read(self) -> bytes:
        """What gevent's recv does, cheaper per token. gevent tries the read first and, on
        EWOULDBLOCK (an exception, nearly always raised: the next token is not there yet), waits
        for the socket under a new Timeout and tries again. Here the wait comes first, then one
        read; and one Timeout per stream stands for the read timeout: when it fires, the stream
        fails only if nothing arrived for the socket's timeout, else it is set for the rest.
        The buffered reader is empty by now: the first read1 took everything it held."""
        gsock = self._gsock
        hub, watcher = gsock.hub, gsock._read_event
        while True:
            if self._watchdog is None and gsock.timeout is not None:
                remaining = self._last + gsock.timeout - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("timed out")  # read() words it as requests does
                self._watchdog = Timeout.start_new(remaining)
            try:
                hub.wait(watcher)
            except Timeout as exc:
                if exc is not self._watchdog:
                    raise
                self._watchdog = None  # fired: check the silence, maybe set it again
                continue
            try:
                return gsock._sock.recv(READ_SIZE)
            except BlockingIOError:  # a spurious wake-up: wait again
                continue

    def close(self) -> None:
        """Stop the read-timeout timer (the caller is done with the body, whatever the outcome)."""
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None

    def _decode(self, data: bytes) -> bytes:
        out = []
        pos, n = 0, len(data)
        while pos < n:
            if self._left:
                end = pos + self._left
                if end <= n:
                    out.append(data[pos:end] if pos or end < n else data)
                    self._left, self._crlf, pos = 0, 2, end
                else:
                    out.append(data[pos:] if pos else data)
                    self._left -= n - pos
                    pos = n
            elif self._crlf:  # http.client skips these two bytes unread; so do we
                skip = min(self._crlf, n - pos)
                self._crlf -= skip
                pos += skip
            else:
                eol = data.find(b"\n", pos)
                if eol < 0:
                    self._line += data[pos:]
                    if len(self._line) > MAX_LINE:
                        raise _broken(ProtocolError("Response chunk size line exceeded maximum allowed length"))
                    break
                line = self._line + data[pos:eol + 1] if self._line else data[pos:eol + 1]
                self._line = b""
                pos = eol + 1
                if self._trailer:
                    if not line.strip():  # the blank line that ends the body
                        self.done = True
                        self._extra = pos < n
                        break
                    continue
                try:
                    size = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    size = -1
                if size < 0:
                    raise _broken(_incomplete(InvalidChunkLength(self.raw, line)))
                if size == 0:
                    self._trailer = True
                else:
                    self._left = size
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    def _eof(self) -> bytes:
        """The server closed the connection."""
        if self._trailer:  # the body was complete; the server just left out the final blank line
            self.done = True
            self._finish()
            return b""
        self._abandon()
        if self._left or self._crlf:
            expected = self._left or self._crlf
            raise _broken(_incomplete(http.client.IncompleteRead(b"", expected)))
        if self._line:
            raise _broken(_incomplete(InvalidChunkLength(self.raw, self._line)))
        raise _broken(ProtocolError("Response ended prematurely"))

    def _finish(self) -> None:
        """Body complete: close the http.client response (as it closes itself at the end of a chunked
        body) and return the connection to the pool; it stays open for the next request."""
        self.close()
        self.resp._content_consumed = True
        if self._extra:  # the server sent more than the body: do not reuse the connection
            self.raw.close()
        else:
            self.hr.close()
        self.raw.release_conn()

    def _abandon(self) -> None:
        """A broken stream: close the connection, as urllib3 does when a read fails."""
        self.close()
        self.resp._content_consumed = True
        try:
            self.raw.close()
        except OSError:
            pass
        self.raw.release_conn()


def read1_chunks(resp, clock: Callable[[], float] = time.perf_counter):
    """(bytes, arrival time) of any body as it arrives, through urllib3's read1 (Content-Length,
    close-delimited, compressed); exceptions as requests' iter_content raises them."""
    raw = resp.raw
    while True:
        try:
            data = raw.read1(READ_SIZE, decode_content=True)
        except ProtocolError as exc:
            raise requests.exceptions.ChunkedEncodingError(exc) from exc
        except DecodeError as exc:
            raise requests.exceptions.ContentDecodingError(exc) from exc
        except ReadTimeoutError as exc:
            raise requests.exceptions.ConnectionError(exc) from exc
        except SSLError as exc:
            raise requests.exceptions.SSLError(exc) from exc
        if not data:
            resp._content_consumed = True
            return
        yield data, clock()


def _incomplete(exc: Exception) -> ProtocolError:
    return ProtocolError(f"Connection broken: {exc!r}", exc)


def _broken(exc: ProtocolError) -> requests.exceptions.ChunkedEncodingError:
    return requests.exceptions.ChunkedEncodingError(exc)


__all__ = ["ChunkedBody", "READ_SIZE", "read1_chunks"]
