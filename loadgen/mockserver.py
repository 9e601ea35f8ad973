"""A tiny OpenAI-compatible SSE server with injected delays and faults, to calibrate the load generator.

`python -m loadgen.mockserver --port 8100 --ttft-ms 200 --itl-ms 50` serves /v1/models,
/v1/chat/completions and /v1/completions. Each stream sends a role chunk at once, then one content
chunk per token at exactly arrival + TTFT + k * ITL (an absolute schedule, so delays do not drift),
then the finish chunk, the usage chunk and `data: [DONE]`. `--faults ok,cut,error` makes successive
requests behave in turn: `cut` closes the connection mid-stream, `error` sends an error event,
`http503` refuses, `nodone` ends cleanly without [DONE], `nousage` omits usage, `hang` goes silent.
Prompt tokens are whitespace words; cached tokens come from a block-hash prefix cache over them.
"""

import argparse
import asyncio
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

FAULTS = ("ok", "cut", "error", "http503", "nodone", "nousage", "hang")


@dataclass(slots=True)
class MockConfig:
    ttft_s: float = 0.2
    itl_s: float = 0.05
    output_tokens: int = 16  # used when the request has no max_tokens
    faults: tuple[str, ...] = ("ok",)
    fault_after_tokens: int = 3
    model: str = "mock-model"
    max_model_len: int = 4096
    block_size: int = 16


@dataclass(slots=True)
class MockStats:
    num_requests: int = 0
    modes: Counter = field(default_factory=Counter)
    num_disconnects: int = 0  # clients that went away mid-stream
    prompts: list[str] = field(default_factory=list)  # the first 200 characters of each
    prompt_words: list[int] = field(default_factory=list)
    max_tokens: list[int] = field(default_factory=list)
    first_token_lag_s: list[float] = field(default_factory=list)  # actual minus scheduled first write


class BlockCache:
    """Chained block hashes over prompt words: how many leading full blocks were seen before."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.seen: set[int] = set()

    def lookup_and_insert(self, words: list[str]) -> int:
        num_hit, parent, hitting = 0, 0, True
        for start in range(0, len(words) - len(words) % self.block_size, self.block_size):
            parent = hash((parent, tuple(words[start:start + self.block_size])))
            if hitting and parent in self.seen:
                num_hit += self.block_size
            else:
                hitting = False
                self.seen.add(parent)
        return min(num_hit, max(0, len(words) - 1))


def _prompt_words(body: dict) -> list[str]:
    if "messages" in body:
        return " ".join(str(m.get("content", "")) for m in body["messages"]).split()
    prompt = body.get("prompt", "")
    return (prompt if isinstance(prompt, str) else " ".join(map(str, prompt))).split()


class MockServer:
    def __init__(self, config: MockConfig):
        self.config = config
        self.stats = MockStats()
        self.cache = BlockCache(config.block_size)
        self.port: int | None = None
        self._frame_cache: dict[bool, dict] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._handle, host, port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def start_in_thread(self) -> int:
        """Run the server's loop in a daemon thread (tests and benchmarks); returns the port."""
        ready = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()
            self._server.close()
            tasks = asyncio.all_tasks(loop)
            for t in tasks:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="mockserver", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self.port

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _one_request(self, reader, writer) -> bool:
        """Serve one request; False when the connection must close."""
        head = await reader.readuntil(b"\r\n\r\n")
        arrival = time.perf_counter()
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await reader.readexactly(int(headers.get("content-length", 0)))
        if method == "GET" and path == "/stats":  # tests and benchmarks; the lateness list drains on read
            st = self.stats
            lags, st.first_token_lag_s = st.first_token_lag_s, []
            await _send_json(writer, 200, {"num_requests": st.num_requests, "modes": dict(st.modes),
                                           "num_disconnects": st.num_disconnects, "prompts": st.prompts,
                                           "prompt_words": st.prompt_words, "max_tokens": st.max_tokens,
                                           "first_token_lag_s": lags})
            return True
        if method == "GET" and path == "/v1/models":
            card = {"id": self.config.model, "object": "model", "created": 0, "owned_by": "loadgen-mock",
                    "max_model_len": self.config.max_model_len}
            await _send_json(writer, 200, {"object": "list", "data": [card]})
            return True
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            await _send_json(writer, 404, _error(f"no route {method} {path}", "not_found"))
            return True
        try:
            request = json.loads(body)
        except json.JSONDecodeError:
            await _send_json(writer, 400, _error("body is not JSON", "invalid_request_error"))
            return True
        return await self._completion(writer, request, path == "/v1/chat/completions", arrival)

    async def _completion(self, writer, request: dict, chat: bool, arrival: float) -> bool:
        stats, cfg = self.stats, self.config
        words = _prompt_words(request)
        if not request.get("stream"):  # a calibration probe, not load: outside the fault cycle
            await asyncio.sleep(cfg.ttft_s)
            usage = {"prompt_tokens": len(words), "completion_tokens": 1, "total_tokens": len(words) + 1}
            await _send_json(writer, 200, {"id": "cmpl-mock", "object": "chat.completion" if chat else
                                           "text_completion", "model": cfg.model, "choices": [], "usage": usage})
            return True
        mode = cfg.faults[stats.num_requests % len(cfg.faults)]
        stats.num_requests += 1
        stats.modes[mode] += 1
        stats.prompts.append(" ".join(words)[:200])
        stats.prompt_words.append(len(words))
        num_tokens = int(request.get("max_tokens") or request.get("max_completion_tokens") or cfg.output_tokens)
        stats.max_tokens.append(num_tokens)
        cached = self.cache.lookup_and_insert(words)
        usage = {"prompt_tokens": len(words), "completion_tokens": num_tokens,
                 "total_tokens": len(words) + num_tokens, "prompt_tokens_details": {"cached_tokens": cached}}
        if mode == "http503":
            await _send_json(writer, 503, _error("server overloaded (injected)", "service_unavailable"))
            return True
        return await self._stream(writer, chat, num_tokens, mode, usage, arrival)

    async def _stream(self, writer, chat: bool, num_tokens: int, mode: str, usage: dict, arrival: float) -> bool:
        cfg = self.config
        frames = self._frames(chat)
        close = b"Connection: close\r\n" if mode == "nodone" else b""  # the client must not reuse it
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                b"Transfer-Encoding: chunked\r\n" + close + b"\r\n")
        try:
            # What is due at the same instant leaves in one write: the headers with the role chunk,
            # then finish, usage, [DONE] and the last chunk. Each token is its own write at its time.
            await _send(writer, head + frames["role"] if chat else head)
            fault = mode in ("cut", "error", "hang") and num_tokens > cfg.fault_after_tokens
            await self._tokens(writer, chat, frames, cfg.fault_after_tokens if fault else num_tokens, arrival)
            if fault:
                return await self._fault(writer, mode)
            tail = frames["finish"]
            if mode != "nousage":
                tail += _frame({"id": "cmpl-mock", "object": "chat.completion.chunk", "model": cfg.model,
                                "choices": [], "usage": usage})
            if mode == "nodone":
                await _send(writer, tail + b"0\r\n\r\n")
                return False
            await _send(writer, tail + frames["done"] + b"0\r\n\r\n")
            return True
        except ConnectionError:
            self.stats.num_disconnects += 1
            return False

    def _tokens(self, writer, chat: bool, frames: dict, count: int, arrival: float) -> asyncio.Future:
        """Write tokens 0..count-1, token k at arrival + TTFT + k * ITL, from the loop's timer
        callbacks (what asyncio.sleep schedules, without a task waking per token); the future is
        done after the last token, or fails with ConnectionResetError when the client went away."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        if count <= 0:
            done.set_result(None)
            return done
        cfg, transport, lags = self.config, writer.transport, self.stats.first_token_lag_s
        to_loop = loop.time() - time.perf_counter()  # perf_counter -> the loop's clock

        def write(k: int) -> None:
            if done.done():  # cancelled (server stopping)
                return
            if k == 0:
                lags.append(time.perf_counter() - (arrival + cfg.ttft_s))
            if transport.is_closing():
                done.set_exception(ConnectionResetError("client went away"))
                return
            token = frames.get(k)
            if token is None:
                token = frames[k] = _frame(_chunk(cfg.model, chat, f" tok{k}"))
            transport.write(token)
            if k + 1 == count:
                done.set_result(None)
            else:
                loop.call_at(arrival + cfg.ttft_s + (k + 1) * cfg.itl_s + to_loop, write, k + 1)

        loop.call_at(arrival + cfg.ttft_s + to_loop, write, 0)
        return done

    def _frames(self, chat: bool) -> dict:
        """Encoded chunks that never change (role, each token, finish, [DONE]), made once."""
        frames = self._frame_cache.get(chat)
        if frames is None:
            model = self.config.model
            frames = self._frame_cache[chat] = {
                "role": _frame(_chunk(model, chat, "", role=True)),
                "finish": _frame(_chunk(model, chat, "", finish="length")), "done": _frame("[DONE]")}
        return frames

    async def _fault(self, writer, mode: str) -> bool:
        if mode == "cut":  # the engine died: the connection closes with no terminating chunk
            await writer.drain()
            return False
        if mode == "hang":
            await asyncio.sleep(3600)
            return False
        await _event(writer, {"error": {"message": "CUDA out of memory (injected)", "type": "internal_error",
                                        "param": None, "code": 500}})
        await _event(writer, "[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def _chunk(model: str, chat: bool, text: str, role: bool = False, finish: str | None = None) -> dict:
    if chat:
        delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "model": model, "choices": [choice]}
    choice = {"index": 0, "text": text, "finish_reason": finish}
    return {"id": "cmpl-mock", "object": "text_completion", "model": model, "choices": [choice]}


def _frame(payload: dict | str) -> bytes:
    """One SSE event as one HTTP chunk."""
    data = payload if isinstance(payload, str) else json.dumps(payload)
    frame = f"data: {data}\n\n".encode()
    return f"{len(frame):x}\r\n".encode() + frame + b"\r\n"


async def _send(writer, data: bytes) -> None:
    writer.write(data)
    if writer.transport.get_write_buffer_size():  # only a slow reader leaves bytes to wait for
        await writer.drain()
    if writer.transport.is_closing():
        raise ConnectionResetError("client went away")


async def _event(writer, payload: dict | str) -> None:
    await _send(writer, _frame(payload))


def _error(message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


async def _send_json(writer, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}[status]
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadgen.mockserver", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--ttft-ms", type=float, default=200.0)
    parser.add_argument("--itl-ms", type=float, default=50.0)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--faults", default="ok", help=f"comma list of {', '.join(FAULTS)}")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--fault-after-tokens", type=int, default=3)
    args = parser.parse_args(argv)
    faults = tuple(args.faults.split(","))
    if bad := [f for f in faults if f not in FAULTS]:
        parser.error(f"--faults: unknown {', '.join(bad)}; choose from {', '.join(FAULTS)}")
    config = MockConfig(ttft_s=args.ttft_ms / 1000, itl_s=args.itl_ms / 1000, output_tokens=args.output_tokens,
                        faults=faults, max_model_len=args.max_model_len,
                        fault_after_tokens=args.fault_after_tokens)

    async def serve() -> None:
        server = MockServer(config)
        port = await server.start(args.host, args.port)
        print(f"mockserver listening on http://{args.host}:{port}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
