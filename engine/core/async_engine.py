"""AsyncEngine: the step loop in its own thread, asyncio consumers fed through per-request queues.

Threads: asyncio callers never touch the LLMEngine. `generate` validates in the caller's thread
(pure checks), then queues an "add" under a small lock; the step thread applies queued adds and
aborts between steps, runs `step()`, and hands the step's outputs to their consumers' event loops
with one `loop.call_soon_threadsafe` per loop (not per request: each call is a lock and a pipe
write in the step thread, and a wake-up of the loop). With nothing to do the step thread sleeps
on a threading.Event.
"""

import asyncio
import logging
import threading
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from engine import errors
from engine.core.engine import LLMEngine, StepResult
from engine.core.outputs import RequestOutput
from engine.core.sampling import SamplingParams
from engine.obs.stats import StepStats

logger = logging.getLogger(__name__)

StepListener = Callable[[StepStats | None, list[RequestOutput]], None]
ErrorListener = Callable[[BaseException, str, list[str]], None]


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


@dataclass(slots=True)
class _PendingAdd:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_ts: float


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_queue_len: int | None = None):
        self.engine = engine
        self.max_queue_len = max_queue_len
        self.is_dead = False
        self.dead_error: BaseException | None = None
        self._lock = threading.Lock()  # guards _pending and _streams
        self._pending: list[_PendingAdd | str] = []  # adds, and request ids to abort
        self._streams: dict[str, _Stream] = {}
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._step_listeners: list[StepListener] = []
        self._error_listeners: list[ErrorListener] = []

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self.is_dead

    def add_step_listener(self, fn: StepListener) -> None:
        self._step_listeners.append(fn)

    def add_error_listener(self, fn: ErrorListener) -> None:
        self._error_listeners.append(fn)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="llm-engine-step", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; requests still in flight finish with ABORT."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        else:  # never started: nothing will serve what is queued
            self._reject_pending(errors.EngineDeadError("the engine is shut down"))

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_ts: float | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Yield each step's delta for the request; the last has finished=True and metrics."""
        self._check_alive()
        self.engine.validate_request(prompt_token_ids, params)
        arrival_ts = self.engine.clock() if arrival_ts is None else arrival_ts
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            self._check_alive()
            if request_id in self._streams:
                raise errors.InvalidRequestError(f"request id {request_id!r} is already in use", param="request_id")
            if self.max_queue_len is not None and self._num_unschedulable() >= self.max_queue_len:
                raise errors.QueueFullError(
                    f"The waiting queue is full ({self.max_queue_len} requests); retry later"
                )
            self._streams[request_id] = _Stream(asyncio.get_running_loop(), queue)
            self._pending.append(_PendingAdd(request_id, list(prompt_token_ids), params, arrival_ts))
        self._wake.set()
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:  # the consumer went away (cancelled, closed): free the blocks now
                self.abort(request_id)
            with self._lock:
                self._streams.pop(request_id, None)

    def _num_unschedulable(self) -> int:
        """Requests that the next step cannot schedule: what --max-queue-len counts (under the lock).

        The engine's waiting queue holds what the last step could not schedule, and nothing
        overtakes it, so while it is not empty every new arrival waits too. While it is empty,
        arrivals since the last step wait only beyond the free batch slots: a burst onto an idle
        engine is scheduled at once, not refused for having arrived between two steps.
        """
        num_pending = sum(isinstance(p, _PendingAdd) for p in self._pending)
        num_waiting = self.engine.num_waiting
        if num_waiting:
            return num_waiting + num_pending
        num_free_slots = self.engine.config.max_num_seqs - self.engine.num_running
        return max(num_pending - num_free_slots, 0)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._pending.append(request_id)
        self._wake.set()

    def _check_alive(self) -> None:
        if self.is_dead:
            raise errors.EngineDeadError(f"the engine loop is dead: {self.dead_error}")
        if self._stop:
            raise errors.EngineDeadError("the engine is shut down")

    # ---- the step thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop:
                self._wake.clear()
                self._apply_pending()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait()
                    continue
                result = self.engine.step()
                self._dispatch(result)
                if self.engine.fatal_error is not None:
                    raise self.engine.fatal_error
            self._abort_all()
        except BaseException as exc:  # noqa: BLE001 - anything escaping a step kills the loop visibly
            self._die(exc, traceback.format_exc())

    def _apply_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for item in pending:
            if isinstance(item, str):
                self.engine.abort_request(item)
                continue
            try:
                self.engine.add_request(item.request_id, item.prompt_token_ids, item.params, item.arrival_ts)
            except errors.EngineError as exc:
                self._deliver(item.request_id, exc)

    def _dispatch(self, result: StepResult) -> None:
        # Sinks first: once a client holds its final output, metrics and logs already count it.
        if result.error is not None:
            self._notify_error(result.error.exc, result.error.traceback, result.error.request_ids)
        for listener in self._step_listeners:
            try:
                listener(result.stats, result.outputs)
            except Exception:  # noqa: BLE001 - a sink must never stop the engine
                logger.exception("step listener failed")
        self._deliver_all([(output.request_id, output) for output in result.outputs])

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        self._deliver_all([(request_id, item)])

    def _deliver_all(self, items: list[tuple[str, RequestOutput | BaseException]]) -> None:
        """One callback per event loop puts every item into its stream's queue, in order."""
        loop_to_puts: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]] = {}
        with self._lock:
            for request_id, item in items:
                stream = self._streams.get(request_id)
                if stream is not None:
                    loop_to_puts.setdefault(stream.loop, []).append((stream.queue, item))
        for loop, puts in loop_to_puts.items():
            try:
                loop.call_soon_threadsafe(_put_all, puts)
            except RuntimeError:  # the consumer's event loop is closed
                pass

    def _notify_error(self, exc: BaseException, tb: str, request_ids: list[str]) -> None:
        for listener in self._error_listeners:
            try:
                listener(exc, tb, request_ids)
            except Exception:  # noqa: BLE001
                logger.exception("error listener failed")

    def _abort_all(self) -> None:
        """Shutdown: requests in the engine finish with ABORT; queued ones get EngineDeadError."""
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
        self._dispatch(self.engine.step())
        self._reject_pending(errors.EngineDeadError("the engine is shut down"))

    def _die(self, exc: BaseException, tb: str) -> None:
        self.dead_error = exc
        self.is_dead = True
        try:
            outputs = self.engine.fail_all(f"EngineDeadError: {type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 - the engine is broken; its consumers must still hear of it
            logger.exception("failing the requests of a dead engine failed")
            outputs = []
        self._notify_error(exc, tb, [o.request_id for o in outputs])
        for listener in self._step_listeners:  # sinks count the error finishes
            try:
                listener(None, outputs)
            except Exception:  # noqa: BLE001
                logger.exception("step listener failed")
        self._deliver_all([(output.request_id, output) for output in outputs])
        self._reject_pending(errors.EngineDeadError(f"the engine loop is dead: {exc}"))

    def _reject_pending(self, exc: errors.EngineDeadError) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        self._deliver_all([(item.request_id, exc) for item in pending if isinstance(item, _PendingAdd)])


def _put_all(puts: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in puts:
        queue.put_nowait(item)
