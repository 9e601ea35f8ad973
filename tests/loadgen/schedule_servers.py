"""OpenAI-style SSE servers on a known schedule, each on a different HTTP stack, to check the load
generator against servers it was not written with.

    python tests/loadgen/schedule_servers.py stdlib --ttft-ms 150 --itl-ms 20 --tokens 32

Kinds: `stdlib` (http.server.ThreadingHTTPServer, HTTP/1.1 chunked, one write and flush per
event), `aiohttp` (aiohttp.web StreamResponse), `starlette` (StreamingResponse under uvicorn).
A stream's first content token goes out `ttft` after the request arrived, each next one `itl`
after the one before (never sooner: a late token delays the rest rather than bunching them), up
to min(max_tokens, tokens). GET /stats answers what the server itself measured per stream.
Prints `listening on http://127.0.0.1:PORT` once ready.
"""

import argparse
import json
import sys
import threading
import time
from dataclasses import dataclass, field

from loadgen.records import perf_to_unix  # the same clock mapping as the client's


@dataclass(slots=True)
class Schedule:
    ttft_s: float
    itl_s: float
    num_tokens: int


@dataclass(slots=True)
class Stats:
    """What the server saw: per finished stream its own TTFT and its shortest gap."""

    num_requests: int = 0
    server_ttft_s: list[float] = field(default_factory=list)
    server_e2e_s: list[float] = field(default_factory=list)  # arrival to the last token's write
    min_gap_s: list[float] = field(default_factory=list)
    sends_unix: dict[str, list[float]] = field(default_factory=dict)  # x-request-id: each token's write, wall clock
    arrivals_unix: dict[str, float] = field(default_factory=dict)  # x-request-id: when its handler started
    peers: dict[str, int] = field(default_factory=dict)  # x-request-id: the client's port (one per connection)
    lock: threading.Lock = field(default_factory=threading.Lock)
    keep_sends: bool = True  # off (--no-sends): requests with an id cost the server what those without do

    def finished(self, ttft_s: float, e2e_s: float, min_gap_s: float | None, request_id: str | None,
                 sends_unix: list[float], arrival_unix: float, peer: int | None) -> None:
        with self.lock:
            if request_id and self.keep_sends:
                self.sends_unix[request_id] = sends_unix
                self.arrivals_unix[request_id] = arrival_unix
                if peer is not None:
                    self.peers[request_id] = peer
            self.server_ttft_s.append(ttft_s)
            self.server_e2e_s.append(e2e_s)
            if min_gap_s is not None:
                self.min_gap_s.append(min_gap_s)

    def as_dict(self) -> dict:
        with self.lock:
            return {"num_requests": self.num_requests, "server_ttft_s": list(self.server_ttft_s),
                    "server_e2e_s": list(self.server_e2e_s), "min_gap_s": list(self.min_gap_s),
                    "sends_unix": dict(self.sends_unix), "arrivals_unix": dict(self.arrivals_unix),
                    "peers": dict(self.peers)}


def _chunk(chat: bool, text: str | None, finish: str | None = None, usage: dict | None = None) -> bytes:
    if usage is not None:
        payload = {"id": "cmpl-sched", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    elif chat:
        payload = {"id": "cmpl-sched", "object": "chat.completion.chunk", "model": "sched-model",
                   "choices": [{"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}]}
    else:
        payload = {"id": "cmpl-sched", "object": "text_completion", "model": "sched-model",
                   "choices": [{"index": 0, "text": text or "", "finish_reason": finish}]}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _num_words(body: dict) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    return len(str(body.get("prompt", "")).split())


def events(body: dict, chat: bool, schedule: Schedule, arrival: float, stats: Stats, request_id: str | None,
           peer: int | None = None):
    """(due time, bytes) of one stream; the caller sleeps until each due time, then sends back the
    perf_counter time it hands the bytes to its write: a client cannot read them sooner (a time taken
    after the write returned could be later than the client's read on a busy machine)."""
    num_tokens = max(1, min(int(body.get("max_tokens") or schedule.num_tokens), schedule.num_tokens))
    due = arrival + schedule.ttft_s
    first = last = None
    min_gap = None
    sends_unix = []
    for k in range(num_tokens):
        sent = yield due, _chunk(chat, f" tok{k}")
        sends_unix.append(perf_to_unix(sent))
        if first is None:
            first = sent
        else:
            gap = sent - last
            min_gap = gap if min_gap is None else min(min_gap, gap)
        last = sent
        due = max(arrival + schedule.ttft_s + (k + 1) * schedule.itl_s, sent + schedule.itl_s)
    usage = {"prompt_tokens": _num_words(body), "completion_tokens": num_tokens,
             "total_tokens": _num_words(body) + num_tokens}
    stats.finished(first - arrival, last - arrival, min_gap, request_id, sends_unix, perf_to_unix(arrival), peer)
    yield None, _chunk(chat, None, "length") + _chunk(chat, None, usage=usage) + b"data: [DONE]\n\n"


def answer(body: dict, chat: bool) -> bytes:
    """A non-streamed answer (the load generator's tokens-per-word probe)."""
    words = _num_words(body)
    choice = {"index": 0, "finish_reason": "length"}
    choice.update({"message": {"role": "assistant", "content": " tok0"}} if chat else {"text": " tok0"})
    return json.dumps({"id": "cmpl-sched", "object": "chat.completion", "choices": [choice],
                       "usage": {"prompt_tokens": words, "completion_tokens": 1, "total_tokens": words + 1}}).encode()


MODELS = json.dumps({"object": "list", "data": [{"id": "sched-model", "object": "model"}]}).encode()


def drive(gen, write, sleep, clock=time.perf_counter) -> None:
    """Run a stream generator with blocking `write(bytes)` and `sleep(seconds)`."""
    due, data = next(gen)
    while True:
        while due is not None and (delay := due - clock()) > 0:  # (a sleep may end a little early)
            sleep(delay)
        handed = clock()
        write(data)
        if due is None:
            return
        try:
            due, data = gen.send(handed)
        except StopIteration:
            return


# --- http.server ------------------------------------------------------------------------------
def serve_stdlib(schedule: Schedule, stats: Stats, port: int):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # TCP_NODELAY, as uvicorn, aiohttp and nginx set it: with Nagle's algorithm a token written
        # while the one before is unacknowledged waits for the client's delayed ACK (40 ms on Linux),
        # then both arrive together.
        disable_nagle_algorithm = True

        def log_message(self, *args) -> None:
            pass

        def _json(self, data: bytes, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/stats":
                self._json(json.dumps(stats.as_dict()).encode())
            else:
                self._json(MODELS)

        def do_POST(self) -> None:
            arrival = time.perf_counter()
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            chat = self.path.endswith("/chat/completions")
            with stats.lock:
                stats.num_requests += 1
            if not body.get("stream"):
                self._json(answer(body, chat))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()

            def write(data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            drive(events(body, chat, schedule, arrival, stats, self.headers.get("x-request-id"), self.client_address[1]),
                  write, time.sleep)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    class Server(ThreadingHTTPServer):
        request_queue_size = 1024  # listen backlog: the default 5 drops connections when many users start
        daemon_threads = True

    server = Server(("127.0.0.1", port), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


# --- aiohttp.web ------------------------------------------------------------------------------
async def _async_stream(body, chat, arrival, write, schedule: Schedule, stats: Stats, request_id, peer) -> None:
    import asyncio

    gen = events(body, chat, schedule, arrival, stats, request_id, peer)
    due, data = next(gen)
    while True:
        # (asyncio may wake up to its clock's resolution early: nothing goes out before it is due)
        while due is not None and (delay := due - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        handed = time.perf_counter()
        await write(data)
        if due is None:
            return
        try:
            due, data = gen.send(handed)
        except StopIteration:
            return


def serve_aiohttp(schedule: Schedule, stats: Stats, port: int):
    import socket

    from aiohttp import web

    async def completions(request: web.Request) -> web.StreamResponse:
        arrival = time.perf_counter()
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        stats.num_requests += 1
        if not body.get("stream"):
            return web.Response(body=answer(body, chat), content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        peer = (request.transport.get_extra_info("peername") or (None, None))[1] if request.transport else None
        await _async_stream(body, chat, arrival, resp.write, schedule, stats, request.headers.get("x-request-id"), peer)
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.Response(body=MODELS, content_type="application/json")

    async def get_stats(request: web.Request) -> web.Response:
        return web.json_response(stats.as_dict())

    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", completions), web.post("/v1/completions", completions),
                    web.get("/v1/models", models), web.get("/stats", get_stats)])
    sock = socket.create_server(("127.0.0.1", port), backlog=1024)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    web.run_app(app, sock=sock, print=None, access_log=None, backlog=1024)


# --- starlette under uvicorn ------------------------------------------------------------------
def serve_starlette(schedule: Schedule, stats: Stats, port: int):
    import asyncio
    import socket

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def completions(request):
        arrival = time.perf_counter()
        body = await request.json()
        chat = request.url.path.endswith("/chat/completions")
        stats.num_requests += 1
        if not body.get("stream"):
            return Response(answer(body, chat), media_type="application/json")
        queue: asyncio.Queue = asyncio.Queue()

        async def produce() -> None:
            await _async_stream(body, chat, arrival, queue.put, schedule, stats, request.headers.get("x-request-id"),
                                request.client.port if request.client else None)
            await queue.put(None)

        async def stream():
            task = asyncio.create_task(produce())
            try:
                while (data := await queue.get()) is not None:
                    yield data
            finally:
                task.cancel()

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def models(request):
        return Response(MODELS, media_type="application/json")

    async def get_stats(request):
        return JSONResponse(stats.as_dict())

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                            Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/models", models), Route("/stats", get_stats)])
    sock = socket.create_server(("127.0.0.1", port), backlog=1024)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, backlog=1024)
    uvicorn.Server(config).run(sockets=[sock])


KINDS = {"stdlib": serve_stdlib, "aiohttp": serve_aiohttp, "starlette": serve_starlette}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=150.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--no-sends", action="store_true",
                        help="keep no per-token write times by request id (a benchmark's client that sends ids "
                             "would otherwise cost the server more memory and garbage collection than one that does not)")
    args = parser.parse_args(argv)
    schedule = Schedule(args.ttft_ms / 1000, args.itl_ms / 1000, args.tokens)
    KINDS[args.kind](schedule, Stats(keep_sends=not args.no_sends), args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
