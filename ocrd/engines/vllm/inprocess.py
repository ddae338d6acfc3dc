"""DeepSeek-OCR-2 in a resident vLLM engine (AsyncLLM) inside the daemon's process.

One engine serves every page of every file: `ocr()` calls run concurrently and vLLM
batches them (continuous batching). vLLM is imported only when the engine starts, so the
rest of ocrd imports without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import structlog

from ocrd.config.engine import EngineConfig, VllmConfig
from ocrd.config.settings import ConfigError
from ocrd.engines import deepseek_ocr2
from ocrd.engines.base import Engine, PageRequest
from ocrd.engines.deepseek_ocr2 import NGRAM_PROCESSOR, AttemptSettings
from ocrd.engines.repetition import Attempt, convert_with_retries
from ocrd.engines.vllm.args import HeadDimGuard, engine_kwargs, fast_encoder_usable
from ocrd.engines.vllm.profile import with_profile
from ocrd.errors import EngineDead, EngineUnavailable
from ocrd.outputs.page import PageOutput
from ocrd.vllm_model import plugin

log = structlog.get_logger(__name__)

# How long close() lets vLLM's shutdown() take before giving up on it.
SHUTDOWN_TIMEOUT_SECONDS = 30.0


def _build_engine(api: _VllmApi, kwargs: dict[str, Any], v: VllmConfig) -> Any:
    """AsyncLLM with ocrd's vLLM plugin told whether to use the fast encoder: through
    the environment of the engine core process that vLLM spawns while building (restored
    afterwards), and directly in this process (where vLLM may have loaded its plugins
    already, and runs the engine core itself with VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    settings = plugin.environment(v.fast_encoder, v.batch_encoder, v.uint8_pixels)
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        if plugin.has_model_code():
            plugin.use(v.fast_encoder)
        return api.AsyncLLM.from_engine_args(api.AsyncEngineArgs(**kwargs))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _request_tag(doc_id: str) -> str:
    """A short, log-friendly piece of the document id for request ids."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", doc_id)[-40:] or "doc"


@dataclass(frozen=True)
class _VllmApi:
    """The parts of vLLM this engine uses, imported on demand."""

    version: str
    AsyncLLM: Any
    AsyncEngineArgs: Any
    SamplingParams: Any
    RepetitionDetectionParams: Any  # None before vLLM 0.19
    EngineDeadError: type[BaseException]
    final_only: Any
    ngram_processor: Any

    @classmethod
    def load(cls) -> _VllmApi:
        try:
            import vllm

            if getattr(vllm, "__file__", None) is None:  # a stray folder named vllm
                raise ImportError("found a namespace package, not vLLM")
        except ImportError as e:
            raise ModuleNotFoundError(
                f"engine.kind 'vllm' needs vLLM, which is not importable here ({e}); "
                "install it with: pip install 'ocr-inbox-daemon[vllm]'", name="vllm") from e
        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineDeadError

        from ocrd.vllm_model.ngram import NGramBanLogitsProcessor

        try:  # vLLM >= 0.19 can end a looping request early
            from vllm.sampling_params import RepetitionDetectionParams
        except ImportError:
            RepetitionDetectionParams = None
        return cls(
            version=getattr(vllm, "__version__", "?"),
            AsyncLLM=AsyncLLM,
            AsyncEngineArgs=AsyncEngineArgs,
            SamplingParams=SamplingParams,
            RepetitionDetectionParams=RepetitionDetectionParams,
            EngineDeadError=EngineDeadError,
            final_only=RequestOutputKind.FINAL_ONLY,
            ngram_processor=NGramBanLogitsProcessor,
        )


class VllmEngine(Engine):
    """DeepSeek-OCR-2 on a vLLM AsyncLLM engine owned by this process."""

    kind = "vllm"
    output_format = deepseek_ocr2.OUTPUT_FORMAT

    def __init__(self, cfg: EngineConfig) -> None:
        """The engine in ocrd's process, as `cfg` says (its profile already applied:
        `create` applies it)."""
        self.cfg = cfg
        self.model = cfg.model
        self.max_concurrency = cfg.vllm.max_num_seqs
        self._engine: Any = None  # vllm.v1.engine.async_llm.AsyncLLM once started
        self._guard: HeadDimGuard | None = None
        self._fast_encoder = False  # asked for and installed; set by start()
        self._dead = False
        self._closing = False
        self._closed = asyncio.Event()  # set by close(): streams still open give up
        self._in_flight: set[str] = set()
        self._ids = itertools.count(1)
        # Request ids must be unique in the engine; the pid keeps them apart in logs of
        # several daemons sharing a GPU host.
        self._id_prefix = f"ocrd{os.getpid()}"
        self._api: _VllmApi | None = None  # vLLM's classes, loaded by start()

    @classmethod
    def create(cls, cfg: EngineConfig) -> Engine:
        """DeepSeek-OCR-2 on this machine's GPUs, laid out as engine.vllm's profile says:
        in ocrd's process, or as local `vllm serve` servers that ocrd supervises
        (engines/vllm/managed.py)."""
        cfg = with_profile(cfg)
        if cfg.vllm.managed:
            from ocrd.engines.vllm.managed import ManagedServerEngine

            return ManagedServerEngine(cfg)
        return cls(cfg)

    @classmethod
    def preflight(cls, cfg: EngineConfig) -> list[str]:
        if importlib.util.find_spec("vllm") is None:
            return [f"engine.kind = {cfg.kind!r}: vLLM is not installed in ocrd's "
                    "environment; install it with pip install 'ocr-inbox-daemon[vllm]' "
                    "(a CUDA GPU is needed)"]
        try:
            with_profile(cfg)
        except ConfigError as e:
            return list(e.problems)
        return []

    # ---- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Build the engine (minutes on a GPU: weights, profiling, CUDA graphs)."""
        # Importing vLLM takes many seconds and AsyncLLM's constructor is synchronous (engine
        # core process, weights, KV cache): both run in worker threads so that the event
        # loop keeps serving health checks and signals meanwhile. Importing in a thread
        # also keeps vLLM's import-time tracebacks from pinning this coroutine's frame
        # (and with it the engine) until the interpreter exits.
        api = await asyncio.to_thread(_VllmApi.load)
        self._api = api
        kwargs = engine_kwargs(self.cfg)
        kwargs["logits_processors"] = [
            api.ngram_processor if p == NGRAM_PROCESSOR else p
            for p in kwargs.get("logits_processors") or []
        ]
        self._guard = kwargs["hf_overrides"]
        self._fast_encoder = fast_encoder_usable(self.cfg)
        log.info("engine_starting", kind=self.kind, model=self.model, vllm=api.version,
                 dtype=self.cfg.vllm.dtype)
        t0 = time.monotonic()
        self._engine = await asyncio.to_thread(
            _build_engine, api, kwargs, self.cfg.vllm)
        # Built off the loop, AsyncLLM defers its output handler task; start it here so
        # that an engine core failure is noticed even before the first page (the lazy
        # start is vLLM's own fallback; the method is private, hence the guard).
        start_handler = getattr(self._engine, "_run_output_handler", None)
        if callable(start_handler):
            start_handler()
        try:
            head_dim = self._engine.model_config.get_head_size()
        except Exception:  # informational only
            head_dim = None
        log.info("engine_started", kind=self.kind, seconds=round(time.monotonic() - t0, 1),
                 head_dim=head_dim, head_dim_override=self._guard.applied)

    async def close(self) -> None:
        """Abort what is in flight, then shut the engine core down."""
        self._closing = True
        self._closed.set()
        engine, self._engine = self._engine, None
        if engine is None:
            return
        ids = list(self._in_flight)
        if ids and not self._dead:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(engine.abort(ids), timeout=5)
            log.info("engine_aborted_requests", kind=self.kind, requests=len(ids))
        # shutdown() joins processes and threads: keep it off the event loop.
        try:
            await asyncio.wait_for(asyncio.to_thread(engine.shutdown),
                                   timeout=SHUTDOWN_TIMEOUT_SECONDS)
        except TimeoutError:
            log.warning("engine_shutdown_timeout", kind=self.kind,
                        seconds=SHUTDOWN_TIMEOUT_SECONDS)

    async def health(self) -> bool:
        engine = self._engine
        if engine is None or self._closing or self._dead:
            return False
        if engine.errored:
            self._dead = True
            return False
        return True

    def describe(self) -> dict:
        info = super().describe()
        info.update(vllm=self._api.version if self._api else None, dtype=self.cfg.vllm.dtype,
                    fast_encoder=self._fast_encoder,
                    max_model_len=self.cfg.vllm.max_model_len,
                    max_num_seqs=self.cfg.vllm.max_num_seqs)
        if self._guard is not None and self._guard.applied is not None:
            info["head_dim_override"] = self._guard.applied
        return info

    def unfinished_requests(self) -> int:
        """Requests the engine holds right now (queued or running), by its own count
        (this engine's own count where vLLM does not offer one)."""
        engine = self._engine
        if engine is None:
            return 0
        count = getattr(engine, "get_num_unfinished_requests", None)
        return count() if callable(count) else len(self._in_flight)

    # ---- pages ----------------------------------------------------------------------

    async def ocr(self, page: PageRequest) -> PageOutput:
        self._check_usable()
        ngram = self.cfg.deepseek_ocr2.ngram
        out = await convert_with_retries(
            lambda n: self._attempt(page, deepseek_ocr2.attempt_settings(ngram, n)),
            self.cfg.loop_retries)
        out.extra.setdefault("engine", self.kind)
        return out

    def _check_usable(self) -> None:
        if self._dead:
            raise EngineDead("the vLLM engine has died; restart ocrd")
        if self._closing:
            raise EngineUnavailable("the vLLM engine is shutting down")
        if self._engine is None:
            raise EngineUnavailable("the vLLM engine is not started")

    def _params(self, api: _VllmApi, settings: AttemptSettings) -> Any:
        kwargs: dict[str, Any] = {
            **deepseek_ocr2.SAMPLING,
            "max_tokens": self.cfg.max_tokens,
            "output_kind": api.final_only,
            "extra_args": settings.extra_args(),
        }
        rep = settings.repetition_params()
        if rep is not None and api.RepetitionDetectionParams is not None:
            kwargs["repetition_detection"] = api.RepetitionDetectionParams(**rep)
        return api.SamplingParams(**kwargs)

    async def _attempt(self, page: PageRequest, settings: AttemptSettings) -> Attempt:
        self._check_usable()
        engine, api = self._engine, self._api
        assert api is not None
        request_id = (f"{self._id_prefix}-{next(self._ids)}-{_request_tag(page.doc_id)}"
                      f"-p{page.page_no}-a{settings.attempt}")
        prompt = {"prompt": deepseek_ocr2.prompt(page), "multi_modal_data": {"image": page.image}}
        self._in_flight.add(request_id)
        try:
            final = await self._generate_unless_closed(
                engine, prompt, self._params(api, settings), request_id)
        except asyncio.CancelledError:
            # generate() aborts on cancellation itself; aborting again is harmless and
            # covers vLLM versions that only stop reading.
            if not self._dead:
                with contextlib.suppress(Exception):
                    await engine.abort(request_id)
            raise
        except api.EngineDeadError as e:
            self._dead = True
            raise EngineDead(f"the vLLM engine died: {e}") from e
        except Exception as e:
            if engine.errored:
                self._dead = True
                raise EngineDead(f"the vLLM engine died: {e}") from e
            raise
        finally:
            self._in_flight.discard(request_id)

        if final is None or not final.outputs:
            raise EngineUnavailable("the vLLM engine returned no output (shutting down?)")
        return self._attempt_from(final, request_id)

    async def _generate_unless_closed(self, engine: Any, prompt: dict, params: Any,
                                      request_id: str) -> Any:
        """The final output of one request, or EngineUnavailable once close() begins.

        A request still in vLLM's input processing when it is aborted can miss the abort
        and then never finish; after shutdown its stream would wait forever. So the
        stream is consumed in a task that close() stops by setting `_closed`."""

        async def consume() -> Any:
            final = None
            async for output in engine.generate(prompt, params, request_id):
                final = output
            return final

        stream = asyncio.ensure_future(consume())
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait({stream, closed}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            stream.cancel()
            raise
        finally:
            closed.cancel()
        if not stream.done():
            stream.cancel()  # cancelling generate() aborts the request in vLLM
            with contextlib.suppress(BaseException):
                await stream
            raise EngineUnavailable("the vLLM engine is shutting down")
        return stream.result()

    def _attempt_from(self, final: Any, request_id: str) -> Attempt:
        completion = final.outputs[0]
        reason = completion.finish_reason or "stop"
        if reason == "abort":
            # Aborted by close() or by vLLM itself: not the page's fault, it is retried.
            raise EngineUnavailable("the vLLM request was aborted (engine shutting down?)")
        if reason == "error":
            raise RuntimeError(f"vLLM failed request {request_id} (finish_reason=error)")
        return Attempt(
            text=completion.text or "",
            finish_reason=reason,
            tokens=len(completion.token_ids),
            prompt_tokens=len(final.prompt_token_ids) if final.prompt_token_ids else None,
            extra=_engine_times(final),
        )


def _engine_times(final: Any) -> dict[str, float]:
    """The engine core's own timestamps for this request (monotonic clock), if recorded.

    They tell when the request was scheduled and decoded, so overlapping spans of several
    pages show continuous batching at work.
    """
    metrics = getattr(final, "metrics", None)
    times = {}
    for name in ("scheduled_ts", "first_token_ts", "last_token_ts"):
        value = getattr(metrics, name, None)
        if isinstance(value, float) and value > 0:
            times[f"engine_{name}"] = value
    return times
