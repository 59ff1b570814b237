"""The engine thread: requests wait in a bounded queue and are decoded together, continuously batched: every
step of the engine is one shared target forward over all running requests (runtime/loop.py), and each request's
token chunks go back to the event loop as they are committed.

    worker = EngineWorker(lambda: Session.open(engine), max_queue=64, max_batch=8)
    session = worker.start_and_wait()                         # opened on the engine thread itself
    worker.check(prompt_ids, config)                           # InputError: can never run here (-> 400)
    job = worker.submit(prompt_ids, config, stops, loop)       # ApiError 429 when the queue is full
    async for event in job.events(): ...                       # ("text", str) ..., then ("done", Finished)
    job.cancel()                                               # the client went away: it leaves within one step

A request joins the batch as soon as a slot and its KV memory are free (`--max-batch`, `--kv-cache-memory`) and
leaves the step it ends; each answer is what `run` gives for its prompt alone (greedy: `--mode ar`'s tokens),
whatever else runs beside it.

The engine is opened on the engine thread and only that thread runs the model: the kernels' OpenMP threads serve
the thread that first used them at full speed, and another thread's calls at a third of it (docs/bench.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from eagle_trt import timing
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.errors import CheckpointError, EagleError
from eagle_trt.runtime.loop import DecodeLoop
from eagle_trt.runtime.session import Session, TextStream
from eagle_trt.runtime.verify_cost import default_sizes, forward_curve
from eagle_trt.serve.metrics import ServeMetrics
from eagle_trt.serve.stops import StopScanner
from eagle_trt.serve.wire import ApiError
from eagle_trt.speculative.step_budget import CostCurve

log = logging.getLogger("eagle_trt.serve")
FINISH = {"eos": "stop", "stopped": "stop", "length": "length", "context": "length"}


@dataclass
class Finished:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    metrics: dict  # the runner's per-request metrics (tau, verify steps, ...)
    accepted_draft_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)  # the answer's tokens, the end token it stopped at included


@dataclass
class Job:
    prompt_ids: list[int]
    config: DecodeConfig
    stops: list[str]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=lambda: timing.now())

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


class Stream:
    """One running job's text: token chunks -> text deltas (stop strings cut across tokens) -> the job's events."""

    def __init__(self, job: Job, tokenizer):
        self.job, self.tokenizer = job, tokenizer
        self.text, self.scan = TextStream(tokenizer), StopScanner(job.stops)
        self.first: float | None = None

    def on_tokens(self, tokens: list[int]) -> bool:
        """The request's commit callback; True ends it (a stop string, or the client went away)."""
        if self.first is None:
            self.first = timing.now()
        text = self.scan.push(self.text.push(tokens))
        if text:
            self.job.put("text", text)
        return self.scan.stopped or self.job.cancelled.is_set()

    def finish(self, request, metrics: ServeMetrics) -> Finished:
        # What the stream held back (an unfinished multi-byte character at the very end), as `run` prints it.
        whole = self.tokenizer.decode(request.output, skip_special_tokens=True)
        rest = self.scan.push(whole[self.text.printed:]) + self.scan.flush()
        if rest:
            self.job.put("text", rest)
        m = request.metrics
        reason = "stop" if self.scan.stopped else FINISH.get(m.stop_reason, "stop")
        metrics.finished(m, len(self.job.prompt_ids), self.job.submitted, self.first)
        accepted = sum(s.accepted for s in m.steps) if m.mode == "eagle" else 0
        return Finished(reason, len(self.job.prompt_ids), len(request.output), m.to_dict(), accepted,
                        list(request.output))


class EngineWorker(threading.Thread):
    def __init__(self, open_session: Callable[[], Session], max_queue: int = 64, metrics: ServeMetrics | None = None,
                 max_batch: int = 8, kv_budget_bytes: int | None = None, size_trees: bool = True):
        super().__init__(name="eagle-trt-engine", daemon=True)
        self.open_session, self.metrics = open_session, metrics or ServeMetrics()
        self.max_queue, self.max_batch, self.kv_budget, self.size_trees = max_queue, max_batch, kv_budget_bytes, \
            size_trees
        self.session: Session | None = None
        self.batch: DecodeLoop | None = None
        self._waiting: deque[Job] = deque()
        self._wake = threading.Condition()
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

    def check(self, prompt_ids: list[int], config: DecodeConfig) -> None:
        """An InputError when this request can never run here (the engine's context, the KV budget)."""
        self.batch.check(prompt_ids, config)

    def submit(self, prompt_ids: list[int], config: DecodeConfig, stops: list[str],
               loop: asyncio.AbstractEventLoop) -> Job:
        if self.stopping.is_set():
            raise ApiError(503, "the server is shutting down", kind="server_error")
        job = Job(prompt_ids, config, stops, loop)
        with self._wake:
            if len(self._waiting) >= self.max_queue:
                raise ApiError(429, "too many requests waiting; retry later", kind="rate_limit_error")
            self._waiting.append(job)
            self._wake.notify()
        self.metrics.waiting.inc()
        return job

    def stop(self) -> None:
        """Refuse new requests; the running and queued ones still finish."""
        self.stopping.set()
        with self._wake:
            self._wake.notify()

    def run(self) -> None:
        try:
            self.session = self.open_session()
            runner = self.session.runner
            self.batch = DecodeLoop(runner, self.max_batch, self.kv_budget, self._cost(runner),
                                     size_trees=self.size_trees)
        except BaseException as e:  # noqa: BLE001 - handed to the thread that waits for it
            self._failed = e
            return
        finally:
            self._ready.set()
        streams: dict[int, tuple[Job, Stream]] = {}
        while True:
            if not self._admit(streams):
                return
            if self.batch.active:
                self.metrics.step_requests.observe(len(self.batch.active))
            try:
                ended = self.batch.step() if self.batch.active else []
            except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the server
                ended, error = list(self.batch.active), _api_error(e)
                self.batch.active.clear()
                for slot in ended:
                    streams.pop(id(slot))[0].put("error", error)
                    self.metrics.running.dec()
                continue
            for slot in ended:
                job, stream = streams.pop(id(slot))
                self.metrics.running.dec()
                self._end(job, lambda: stream.finish(slot.request, self.metrics))

    def _cost(self, runner):
        """The verify-cost curve the batch plan reads, measured on this machine now (a second or two)."""
        if self.max_batch < 2 and not self.size_trees:
            return None
        sizes = default_sizes(min(max(64, 16 * self.max_batch), 512))
        return CostCurve({t: 1e3 * sec for t, sec in forward_curve(runner.target, sizes, reps=3,
                                                                   aux_layers=runner.aux_layers,
                                                                   clock=runner.clock).items()})

    def _admit(self, streams: dict) -> bool:
        """Move waiting jobs into the batch while they fit (blocking while there is nothing at all to do); False
        once stopping with nothing left."""
        with self._wake:
            while not self._waiting and not self.batch.active:
                if self.stopping.is_set():
                    return False
                self._wake.wait()
            while self._waiting:
                job = self._waiting[0]
                if job.cancelled.is_set():
                    self._waiting.popleft()
                    self.metrics.waiting.dec()
                    continue
                stream = Stream(job, self.session.tokenizer)
                try:
                    slot = self.batch.admit(job.prompt_ids, job.config, stream.on_tokens, job.cancelled.is_set)
                except Exception as e:  # noqa: BLE001 - one request's failure must not take the server down
                    self._waiting.popleft()
                    self.metrics.waiting.dec()
                    job.put("error", _api_error(e))
                    continue
                if slot is None:
                    break  # full: it waits for a request to leave
                self._waiting.popleft()
                self.metrics.waiting.dec()
                self.metrics.running.inc()
                streams[id(slot)] = (job, stream)
        return True

    @staticmethod
    def _end(job: Job, finish: Callable[[], Finished]) -> None:
        try:
            job.put("done", finish())
        except Exception as e:  # noqa: BLE001
            job.put("error", _api_error(e))


def _api_error(e: Exception) -> ApiError:
    """What a request's client is told when its step failed: the engine's own one-line message where there is one
    (400 for the request, 500 for the model), else an id to find the exception in the server's log (no internals
    go to the client)."""
    if isinstance(e, CheckpointError):  # the model itself failed (e.g. hidden states that overflow): not the request
        return ApiError(500, str(e), kind="server_error")
    if isinstance(e, EagleError):  # a request the engine cannot take (too long for its context, ...)
        return ApiError(400, str(e))
    eid = uuid.uuid4().hex[:12]
    log.error("error %s in the engine step: %s: %s", eid, type(e).__name__, e,
              exc_info=os.environ.get("EAGLE_TRT_DEBUG") == "1")
    return ApiError(500, f"internal error (id {eid}); the server's log has its details", kind="server_error")
