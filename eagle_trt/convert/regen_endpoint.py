"""`convert --regenerate --regenerate-endpoint URL[,URL...]`: the target's greedy answers from OpenAI-compatible
servers (trtllm-serve, vLLM, SGLang, `eagle-trt serve`) instead of transformers' `generate`.

    options = EndpointOptions.parse("http://10.0.0.5:8000,http://10.0.0.6:8000", concurrency=16)
    served = connect(options, "models/Qwen3-8B")          # GET /v1/models on each: reachable, serving the target
    answer = EndpointRegenerator(served, model, tokenizer, eos, work / PROGRESS_NAME, {"target": stamp})
    answers = answer(prompt_ids_list, max_new_tokens=256, progress=True)

Each prompt goes to POST /v1/completions as its token ids (the chat template already applied here, by the tokenizer
that tokenizes the training text), greedy (temperature 0), asking for the answer's token ids back
(`return_token_ids`; a server that has no such field gets the request without it, and its text is tokenized here).
Completions rather than chat completions: the server then conditions on exactly the prompt the head trains on, not
on its own rendering of the messages (another template version, a default system prompt, a second BOS), and raw
completion prompts (`"chat": false`) need no chat form (docs/regeneration.md).

The requests are spread over the URLs: `concurrency` of them in flight per URL, all URLs drawing from one queue (a
faster server takes more). A connection error, timeout, 429 or 5xx is retried with backoff (`endpoint_http.py`); a
URL that stays down drops out and its prompt goes back to the queue, and the run fails only when none is left. Every
answer is appended to the work dir's progress file as it arrives (`regen_progress.py`), so a killed run asks only
for what was not answered. Before the bulk, each URL's first answers are scored under the local target
(`regen_probe.py`): a server whose model is not the target is refused before any of its answers are kept.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeRemainingColumn

from eagle_trt.errors import EndpointError

from .endpoint_http import Endpoint, EndpointDown, EndpointRefused, Retry, Stopped, base_url
from .regen_probe import MIN_AGREEMENT, Agreement, teacher_forced
from .regen_progress import Progress, prompt_key

PROGRESS_NAME = "regenerated.jsonl"
PROBE_PROMPTS = 2  # per URL, scored before any answer of that URL is kept
MAX_CONCURRENCY = 1024
MAX_RETRIES = 100


@dataclass(frozen=True)
class EndpointOptions:
    urls: tuple[str, ...]
    model: str | None = None  # the served model id to ask for (default: the one that names the target)
    concurrency: int = 8  # requests in flight per URL
    retries: int = 5  # tries after the first, per request
    api_key: str | None = None
    timeout_s: float = 600.0  # one request; a long greedy answer on a loaded server takes minutes

    @classmethod
    def parse(cls, spec: str, *, model: str | None = None, concurrency: int = 8, retries: int = 5,
              api_key: str | None = None) -> EndpointOptions:
        urls = [base_url(u) for u in spec.split(",") if u.strip()]
        if not urls:
            raise EndpointError("--regenerate-endpoint: give a server's URL (several: comma-separated)")
        if len(set(urls)) != len(urls):
            raise EndpointError(f"--regenerate-endpoint names a URL twice ({spec}); raise --regenerate-concurrency "
                                "instead")
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise EndpointError(f"--regenerate-concurrency must be in [1, {MAX_CONCURRENCY}]; got {concurrency}")
        if not 0 <= retries <= MAX_RETRIES:
            raise EndpointError(f"--regenerate-retries must be in [0, {MAX_RETRIES}]; got {retries}")
        if model is not None and not model.strip():
            raise EndpointError("--regenerate-model is empty; give the model id the server lists at /v1/models")
        return cls(tuple(urls), model, concurrency, retries, api_key)


@dataclass
class Served:
    """The endpoints, checked: each reachable and listing `model`."""

    options: EndpointOptions
    endpoints: list[Endpoint]
    model: str
    target: str  # the target's name, for messages
    stop: threading.Event = field(default_factory=threading.Event)


# ---- which model ------------------------------------------------------------------------------------
def _norm(name: str) -> str:
    last = str(name).strip().rstrip("/").split("/")[-1].lower()
    return last[: -len(".gguf")] if last.endswith(".gguf") else last


def target_names(model_path: str | Path) -> list[str]:
    """What the target being converted may be served as: its dir or file name, and the name its config.json records
    (`_name_or_path`, e.g. 'Qwen/Qwen3-8B'), compared by their last path part, case-insensitively."""
    path = Path(model_path).expanduser()
    names = [path.resolve().name or str(path)]
    try:
        recorded = json.loads((path / "config.json").read_text()).get("_name_or_path") if path.is_dir() else None
    except (OSError, json.JSONDecodeError, AttributeError):
        recorded = None
    if isinstance(recorded, str) and recorded.strip():
        names.append(recorded)
    return names


def _model_ids(ep: Endpoint) -> list[str]:
    doc = ep.get("/v1/models")
    data = doc.get("data")
    ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else None
    if not ids or not all(isinstance(i, str) for i in ids):
        raise EndpointError(f"{ep.url}/v1/models lists no model ids ({json.dumps(doc)[:120]}); is this an "
                            "OpenAI-compatible server?")
    return ids


def _choose(listed: dict[str, list[str]], names: list[str]) -> str:
    """With no --regenerate-model: the one id of the first URL that names the target, or its only id."""
    url, ids = next(iter(listed.items()))
    wanted = {_norm(n) for n in names}
    naming = [i for i in ids if _norm(i) in wanted]
    if len(naming) == 1 or len(ids) == 1:
        return naming[0] if naming else ids[0]
    raise EndpointError(f"{url} serves {', '.join(ids)}: name the target's with --regenerate-model")


def connect(options: EndpointOptions, model_path: str | Path) -> Served:
    """Every URL reached (GET /v1/models, retried like any request) and listing the model to ask for; without
    --regenerate-model, that model's id must name the target (`target_names`). Runs before the target loads."""
    stop = threading.Event()
    endpoints = [Endpoint(u, options.api_key, options.timeout_s, Retry(options.retries), stop) for u in options.urls]
    listed = {ep.url: _model_ids(ep) for ep in endpoints}
    names = target_names(model_path)
    model = options.model or _choose(listed, names)
    for url, ids in listed.items():
        if model not in ids:
            raise EndpointError(f"{url} serves {', '.join(repr(i) for i in ids)}, not '{model}'; every "
                                "--regenerate-endpoint must serve the target being converted")
    if options.model is None and _norm(model) not in {_norm(n) for n in names}:
        raise EndpointError(f"{endpoints[0].url} serves '{model}', not the target being converted ('{names[0]}'); if "
                            f"it is that model under another name, pass --regenerate-model '{model}' (its answers are "
                            "checked against the target's either way)")
    return Served(options, endpoints, model, names[0], stop)


# ---- answering ----------------------------------------------------------------------------------------
class EndpointRegenerator:
    """Answers prompts through `served`'s endpoints: a callable `build_dataset` takes in place of local generation."""

    def __init__(self, served: Served, model, tokenizer, eos: list[int], progress_path: str | Path,
                 identity: dict):
        self.served, self.model, self.tokenizer = served, model, tokenizer
        self.eos, self.path, self.identity = [int(e) for e in eos], Path(progress_path), identity
        self.vocab = int(model.config.vocab_size)
        self.token_ids = {ep.url: True for ep in served.endpoints}  # False: the server has no return_token_ids
        self.stats: dict = {}
        self._bar = None

    def __call__(self, prompts: list[list[int]], max_new_tokens: int, progress: bool = True) -> list[list[int]]:
        keys = [prompt_key(p) for p in prompts]
        by_key = dict(zip(keys, prompts))
        with Progress(self.path, {**self.identity, "max_new_tokens": max_new_tokens}) as store:
            pending = [k for k in by_key if k not in store.answers]  # each distinct prompt asked once
            self.stats = {"model": self.served.model, "endpoints": [ep.url for ep in self.served.endpoints],
                          "prompts": len(by_key), "resumed": len(by_key) - len(pending), "asked": len(pending)}
            with self._progress(progress, len(by_key), len(by_key) - len(pending)):
                pending = self._probe(store, pending, by_key, max_new_tokens)
                self._bulk(store, deque(pending), by_key, max_new_tokens)
            self.stats["token_ids"] = dict(self.token_ids)
            return [list(store.answers[k]) for k in keys]

    # Probe: each URL's first answers, held back until they score as the target's.
    def _probe(self, store: Progress, pending: list[str], by_key: dict, n: int) -> list[str]:
        eps = self.served.endpoints
        share = {ep.url: deque(pending[i:len(eps) * PROBE_PROMPTS:len(eps)]) for i, ep in enumerate(eps)}
        got: dict[str, list[tuple[str, list[int]]]] = {ep.url: [] for ep in eps}

        def loop(ep: Endpoint) -> None:
            while share[ep.url] and not self.served.stop.is_set():
                key = share[ep.url].popleft()
                got[ep.url].append((key, self._ask(ep, by_key[key], n)))

        self._threads([(ep, loop) for ep in eps if share[ep.url]])
        self.stats["probe"] = {}
        for ep in eps:
            agree = Agreement()
            for key, answer in got[ep.url]:
                agree.add(teacher_forced(self.model, by_key[key], answer))
            if agree.answers:
                self._check(ep, agree)
                self.stats["probe"][ep.url] = {"answers": agree.answers, "tokens": agree.compared,
                                               "agreement": round(agree.rate, 4)}
        for ep in eps:
            for key, answer in got[ep.url]:
                store.append(key, answer)
                self._advance()
        done = {key for ep in eps for key, _ in got[ep.url]}
        return [k for k in pending if k not in done]

    def _check(self, ep: Endpoint, agree: Agreement) -> None:
        if agree.rate >= MIN_AGREEMENT:
            return
        m = agree.first
        where = "" if m is None else (f"; first difference at answer token {m.position}: the server's {m.served} "
                                      f"{self._piece(m.served)} against the target's {m.target} "
                                      f"{self._piece(m.target)}")
        raise EndpointError(f"{ep.url} serves '{self.served.model}', but its greedy answers are not the target's: "
                            f"{agree.matched} of {agree.compared} tokens are what '{self.served.target}' picks given "
                            f"the same text (at least {MIN_AGREEMENT:.0%} needed){where}; point "
                            "--regenerate-endpoint at a server of this very model (same weights)")

    def _piece(self, token: int) -> str:
        try:
            return repr(self.tokenizer.decode([token]))
        except Exception:  # noqa: BLE001 - only decoration for the message
            return ""

    # Bulk: every URL's threads draw from one queue; a URL that stays down hands its prompt back and drops out.
    def _bulk(self, store: Progress, queue: deque, by_key: dict, n: int) -> None:
        lock, down = threading.Lock(), {}

        def loop(ep: Endpoint) -> None:
            while not self.served.stop.is_set() and ep.url not in down:
                with lock:
                    if not queue:
                        return
                    key = queue.popleft()
                try:
                    answer = self._ask(ep, by_key[key], n)
                except EndpointDown as e:
                    with lock:
                        queue.appendleft(key)
                        if ep.url not in down:
                            down[ep.url] = e
                            self._warn(f"{ep.url} dropped out: {e}")
                    return
                store.append(key, answer)
                self._advance()

        while queue:  # again while a prompt a dropped URL handed back waits and some URL is left
            alive = [ep for ep in self.served.endpoints if ep.url not in down]
            if not alive:
                raise list(down.values())[-1]
            self._threads([(ep, loop) for ep in alive for _ in range(self.served.options.concurrency)])

    def _threads(self, work: list) -> None:
        """Run each (endpoint, loop) on its own thread; the first error stops the others and is raised here."""
        errors: list[BaseException] = []

        def run(ep, loop):
            try:
                loop(ep)
            except Stopped:
                pass
            except BaseException as e:  # noqa: BLE001 - handed to the thread that waits
                errors.append(e)
                self.served.stop.set()

        threads = [threading.Thread(target=run, args=w, daemon=True, name="eagle-trt-regenerate") for w in work]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.2)  # short joins: Ctrl-C reaches this thread
        except BaseException:
            self.served.stop.set()  # threads leave after their request; a retry's wait is cut short
            raise
        if errors:
            raise errors[0]

    # One request.
    def _ask(self, ep: Endpoint, prompt: list[int], n: int) -> list[int]:
        # Greedy, and every setting that would bend it neutral: a server fills what a request leaves out from its
        # own defaults (vLLM takes them from the model's generation_config.json, repetition_penalty included).
        body = {"model": self.served.model, "prompt": list(prompt), "max_tokens": n, "temperature": 0, "top_p": 1,
                "presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "n": 1, "stream": False}
        if self.token_ids[ep.url]:
            body["return_token_ids"] = True
        try:
            doc = ep.post("/v1/completions", body)
        except EndpointRefused as e:
            if "return_token_ids" not in body or "return_token_ids" not in e.server_says:
                raise EndpointError(f"{e} (regeneration sends /v1/completions a greedy request whose prompt is a "
                                    "list of token ids)") from None
            self.token_ids[ep.url] = False  # this server has no such field: its text is tokenized here
            del body["return_token_ids"]
            doc = ep.post("/v1/completions", body)
        return self._answer(ep, doc, n)

    def _answer(self, ep: Endpoint, doc: dict, n: int) -> list[int]:
        """The answer's token ids: the server's own where it returned them, else its text tokenized here; an answer
        that ended (finish_reason 'stop') ends with the end token, as local regeneration's do."""
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise EndpointError(f"{ep.url}/v1/completions answered without choices ({json.dumps(doc)[:120]})")
        choice = choices[0]
        ids = choice.get("token_ids")
        if not (isinstance(ids, list) and all(isinstance(t, int) for t in ids)):
            text = choice.get("text")
            if not isinstance(text, str):
                raise EndpointError(f"{ep.url}/v1/completions answered with neither token_ids nor text")
            ids = [int(t) for t in self.tokenizer(text, add_special_tokens=False).input_ids]
        ids = ids[:n]
        bad = next((t for t in ids if not 0 <= t < self.vocab), None)
        if bad is not None:
            raise EndpointError(f"{ep.url} answered token id {bad}, outside the target's vocabulary of {self.vocab}: "
                                "it serves another model")
        if choice.get("finish_reason") == "stop" and len(ids) < n and self.eos and (not ids or ids[-1] not in self.eos):
            ids.append(self.eos[0])
        return ids

    # Progress display.
    def _progress(self, enabled: bool, total: int, done: int):
        if not enabled:
            return contextlib.nullcontext()
        bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True))
        self._bar = (bar, bar.add_task(f"Regenerating answers through {len(self.served.endpoints)} endpoint(s)",
                                       total=total, completed=done))
        return bar

    def _advance(self) -> None:
        if self._bar is not None:
            self._bar[0].advance(self._bar[1])

    def _warn(self, message: str) -> None:
        if self._bar is not None:
            self._bar[0].console.print(f"Warning: {message}", markup=False)
        else:
            print(f"Warning: {message}", file=sys.stderr)
