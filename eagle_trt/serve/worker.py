"""The engine thread: requests wait in a bounded queue and are decoded one at a time on the engine's runner, each
token chunk handed back to the event loop as it is committed.

    worker = EngineWorker(lambda: Session.open(engine), max_queue=64)
    session = worker.start_and_wait()                         # opened on the engine thread itself
    job = worker.submit(prompt_ids, config, stops, loop)       # ApiError 429 when the queue is full
    async for event in job.events(): ...                       # ("text", str) ..., then ("done", Finished)
    job.cancel()                                               # the client went away: ends within one step

One request at a time: every request's output is what `run` gives for it alone (the same runner, the same kernels),
whatever else is queued. Batching concurrent requests into shared verify passes is not done yet.

The engine is opened on the engine thread and only that thread runs the model: the kernels' OpenMP threads serve
the thread that first used them at full speed, and another thread's calls at a third of it (docs/bench.md).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from eagle_trt.config.decode import DecodeConfig
from eagle_trt.errors import EagleError
from eagle_trt.runtime.session import Session, TextStream
from eagle_trt.serve.metrics import ServeMetrics
from eagle_trt.serve.stops import StopScanner
from eagle_trt.serve.wire import ApiError

FINISH = {"eos": "stop", "stopped": "stop", "length": "length", "context": "length"}


@dataclass
class Finished:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    metrics: dict  # the runner's per-request metrics (tau, verify steps, ...)
    accepted_draft_tokens: int = 0


@dataclass
class Job:
    prompt_ids: list[int]
    config: DecodeConfig
    stops: list[str]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        self.cancelled.set()

    def put(self, kind: str, value) -> None:
        """From the engine thread: hand an event to the request's handler on the event loop."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))

    async def events(self):
        while True:
            kind, value = await self.queue.get()
            yield kind, value
            if kind in ("done", "error"):
                return


class EngineWorker(threading.Thread):
    def __init__(self, open_session: Callable[[], Session], max_queue: int = 64, metrics: ServeMetrics | None = None):
        super().__init__(name="eagle-trt-engine", daemon=True)
        self.open_session, self.metrics = open_session, metrics or ServeMetrics()
        self.session: Session | None = None
        self.jobs: queue.Queue = queue.Queue(maxsize=max_queue)
        self.stopping = threading.Event()
        self._ready = threading.Event()
        self._failed: BaseException | None = None

    def start_and_wait(self) -> Session:
        """Start the thread, and return the session once it has opened it (or raise what opening raised)."""
        self.start()
        self._ready.wait()
        if self._failed is not None:
            raise self._failed
        return self.session

    def submit(self, prompt_ids: list[int], config: DecodeConfig, stops: list[str],
               loop: asyncio.AbstractEventLoop) -> Job:
        if self.stopping.is_set():
            raise ApiError(503, "the server is shutting down", kind="server_error")
        job = Job(prompt_ids, config, stops, loop)
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise ApiError(429, "too many requests waiting; retry later", kind="rate_limit_error") from None
        self.metrics.waiting.inc()
        return job

    def stop(self) -> None:
        """Finish the running request and refuse new ones; queued ones still run."""
        self.stopping.set()
        self.jobs.put(None)

    def run(self) -> None:
        try:
            self.session = self.open_session()
        except BaseException as e:  # noqa: BLE001 - handed to the thread that waits for it
            self._failed = e
            return
        finally:
            self._ready.set()
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self.metrics.waiting.dec()
            if job.cancelled.is_set():
                continue
            self.metrics.running.inc()
            try:
                job.put("done", self._decode(job))
            except EagleError as e:  # a request the engine cannot take (too long for its context, ...)
                job.put("error", ApiError(400, str(e)))
            except Exception as e:  # noqa: BLE001 - one request's failure must not take the server down
                job.put("error", ApiError(500, f"{type(e).__name__}: {e}", kind="server_error"))
            finally:
                self.metrics.running.dec()

    def _decode(self, job: Job) -> Finished:
        stream, scan = TextStream(self.session.tokenizer), StopScanner(job.stops)
        first = []

        def on_tokens(tokens: list[int]) -> bool:
            if not first:
                first.append(time.perf_counter())
            text = scan.push(stream.push(tokens))
            if text:
                job.put("text", text)
            return scan.stopped or job.cancelled.is_set()

        result = self.session.runner.generate(job.prompt_ids, job.config, on_tokens=on_tokens)
        # What the stream held back (an unfinished multi-byte character at the very end), as `run` prints it.
        whole = self.session.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        rest = scan.push(whole[stream.printed:]) + scan.flush()
        if rest:
            job.put("text", rest)
        m = result.metrics
        reason = "stop" if scan.stopped else FINISH.get(m.stop_reason, "stop")
        self.metrics.finished(m, len(job.prompt_ids), job.submitted, first[0] if first else None)
        accepted = sum(s.accepted for s in m.steps) if m.mode == "eagle" else 0
        return Finished(reason, len(job.prompt_ids), len(result.token_ids), m.to_dict(), accepted)
