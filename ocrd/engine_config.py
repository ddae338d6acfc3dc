"""The `engine:` section of the configuration (config.py reads the whole file): which
engine, and the settings of each kind. Unknown keys are errors here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_MODEL = "deepseek-ai/DeepSeek-OCR-2"


class _Strict(BaseModel):
    """Every configuration section: unknown keys are errors, defaults validated too."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class TesseractConfig(_Strict):
    lang: str = "eng"
    psm: int = Field(default=3, ge=0, le=13)
    # tesseract processes at once; 0 = one per CPU core
    workers: int = Field(default=0, ge=0)
    timeout_seconds: float = Field(default=300.0, gt=0)
    # a page read with little confidence is checked with tesseract's OSD and turned
    orientation: bool = True
    # OSD's confidence below which a page is read as it lies
    orientation_confidence: float = Field(default=5.0, ge=0)


class NGramConfig(_Strict):
    """DeepSeek-OCR-2's anti-repetition logits processor (per request)."""

    ngram_size: int = Field(default=30, ge=1)
    window_size: int = Field(default=90, ge=1)
    whitelist_token_ids: list[int] = Field(default_factory=lambda: [128821, 128822])


class VllmConfig(_Strict):
    # auto: a layout measured for the GPUs ocrd finds (ocrd/engines/gpu_profile.py; the
    # README's table "your GPU → what ocrd runs"), logged at start as vllm_profile; every
    # key set here overrides the profile's value. none: the keys set here and the defaults.
    profile: Literal["auto", "none"] = "auto"
    # inprocess: the engine runs inside ocrd (vLLM's AsyncLLM). managed: ocrd starts and
    # supervises local `vllm serve` processes and feeds them over HTTP (several front ends,
    # servers per GPU, GPUs: api_servers, servers_per_gpu, gpus). null: the profile's.
    mode: Literal["inprocess", "managed"] | None = None
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    max_model_len: int = Field(default=8192, ge=256)
    max_num_seqs: int = Field(default=100, ge=1)
    # Tokens one engine step may take in (decode + prefill of new pages, and the budget
    # of page images encoded per step: ~1.1k tokens per A4 page). vLLM's offline default
    # on large GPUs; `vllm serve` would default to 8192. 0: vLLM's default.
    max_num_batched_tokens: int = Field(default=16384, ge=0)
    tensor_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int = Field(default=1, ge=1)
    # Managed mode: front-end processes that prepare page images, per GPU (one front end
    # is one CPU thread of image preparation: `vllm serve --api-server-count N`).
    api_servers: int = Field(default=1, ge=1)
    # A managed server's port on 127.0.0.1 (several servers: this and the next ones);
    # 0 = free ports.
    server_port: int = Field(default=0, ge=0, le=65535)
    # Managed servers on each GPU (or group of tensor_parallel_size × data_parallel_size
    # GPUs): one engine core each, gpu_memory_utilization and api_servers split among
    # them (api_servers // servers_per_gpu each, at least 1); ocrd balances pages across
    # them (one engine core cannot keep a big GPU busy: bench/GPU_RESULTS.md).
    servers_per_gpu: int = Field(default=1, ge=1, le=16)
    # Managed mode: CUDA MPS for the servers of a GPU (ocrd/engines/mps.py: one
    # nvidia-cuda-mps-control per group of GPUs, started and stopped by ocrd), so that
    # their kernels run side by side instead of in turns. null: where servers share a
    # GPU and the control program is found (a warning where it cannot start); true:
    # every group, and an error where it cannot start; false: never.
    mps: bool | None = None
    # Managed mode: pages sent to each server beyond its batch (max_num_seqs), to wait
    # in its queue already prepared by its front ends. null: 4 per front end. A whole
    # batch more was 4 % slower on an H200 (bench/GPU_RESULTS.md round 9): the front ends
    # and engine cores take them in on the CPU the engine cores' steps need.
    queue_per_server: int | None = Field(default=None, ge=0)
    # Managed mode on these CUDA devices (ids as nvidia-smi numbers them): one group of
    # servers per tensor_parallel_size × data_parallel_size devices, each server started
    # with CUDA_VISIBLE_DEVICES set to its group. []: the devices ocrd's environment
    # shows, one group.
    gpus: list[int] = Field(default_factory=list)
    # ocrd's DeepSeek-OCR-2 vision encoder path (on vLLM <= 0.24 with a vectorised
    # attention mask; one host sync per step): 151 -> 60 ms of engine time per page on an
    # H200 page by page, 36 ms batched (ocrd/vllm_model/dsocr2_fast.py, bench/GPU_RESULTS.md).
    # Needs ocrd installed with its entry points (pip install), which vLLM loads.
    fast_encoder: bool = True
    # With fast_encoder: encode the step's pages together, in padded calls of 8/4/2/1
    # global views and 24/12/6/3 tiles (OCRD_VLLM_ENCODER_BUCKETS=0: always the full
    # size, so a page's embeddings do not depend on the pages sharing its step). null:
    # on where the model runs on a GPU, off on a CPU. false: vLLM's shapes, page by page
    # (the same embeddings as vLLM's own code, to the bit).
    batch_encoder: bool | None = None
    # With fast_encoder: page views go from vLLM's front ends to its engine core as uint8
    # (13.8 MB per A4 page instead of 27.5 MB of bf16) and are normalised on the GPU,
    # into the very values vLLM's processor makes (ocrd/vllm_model/dsocr2_pixels.py).
    # false: vLLM's float views.
    uint8_pixels: bool = True
    # Further AsyncEngineArgs, passed through as they are (e.g. enforce_eager: true);
    # in the managed mode they become `vllm serve` flags (enforce_eager → --enforce-eager).
    engine_args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _gpu_groups(self) -> VllmConfig:
        per = self.tensor_parallel_size * self.data_parallel_size
        if len(set(self.gpus)) != len(self.gpus) or any(g < 0 for g in self.gpus):
            raise ValueError(f"gpus {self.gpus}: each device once, numbers >= 0")
        if self.gpus and len(self.gpus) % per:
            raise ValueError(f"gpus {self.gpus}: {len(self.gpus)} devices do not split into "
                             f"groups of tensor_parallel_size × data_parallel_size = {per}")
        if self.mode == "inprocess":
            managed_only = {"api_servers": self.api_servers > 1,
                            "servers_per_gpu": self.servers_per_gpu > 1, "gpus": self.gpus}
            for key, used in managed_only.items():
                if used:
                    raise ValueError(f"{key} {getattr(self, key)} needs mode: managed (the "
                                     "engine inside ocrd has one front end on one GPU)")
        if self.server_port and self.server_port + self.server_count - 1 > 65535:
            raise ValueError(f"server_port {self.server_port}: the {self.server_count} "
                             "managed servers' ports would pass 65535")
        return self

    @property
    def server_count(self) -> int:
        """Managed `vllm serve` processes: servers_per_gpu per group of GPUs."""
        per = self.tensor_parallel_size * self.data_parallel_size
        return max(1, len(self.gpus) // per) * self.servers_per_gpu

    @property
    def managed(self) -> bool:
        """ocrd starts and supervises local `vllm serve` processes (ocrd/engines/managed.py)
        instead of running the engine inside its own process (mode, once resolved)."""
        return self.mode == "managed"


class SimulatedConfig(_Strict):
    """A stand-in for a continuous-batching GPU engine, for benchmarks and tests: one
    stepping loop decodes every active page at once; nothing is read or learned."""

    # pages decoded together in one step; more wait in the engine's queue
    max_batch: int = Field(default=16, ge=1)
    # one step takes step_seconds + step_per_page_seconds × pages in the batch
    step_seconds: float = Field(default=0.02, ge=0)
    step_per_page_seconds: float = Field(default=0.001, ge=0)
    # a page's prefill (its image) adds this much to the step it enters the batch in
    prefill_seconds_per_megapixel: float = Field(default=0.005, ge=0)
    # decode steps (output tokens) per page, varied by up to ± this fraction per page
    # (deterministically, from the document and page number)
    decode_steps: int = Field(default=24, ge=1)
    decode_jitter: float = Field(default=0.5, ge=0, lt=1)
    # pages the daemon keeps in flight with this engine; 0 = max_batch + 2, a small
    # queue so that a freed batch place is refilled at the very next step
    concurrency: int = Field(default=0, ge=0)
    # answer every page at once (zero step time): measures the daemon's own overhead
    instant: bool = False


class TestingFaultsConfig(_Strict):
    """Fault injection around any engine, for reliability tests only: every N-th page
    (counted per daemon run) meets the fault; 0 turns it off."""

    error_every: int = Field(default=0, ge=0)  # raises an error
    hang_every: int = Field(default=0, ge=0)  # never answers (page timeout)
    garbage_every: int = Field(default=0, ge=0)  # returns random characters
    die_after: int = Field(default=0, ge=0)  # the engine dies after this many pages
    unavailable_seconds: float = Field(default=0.0, ge=0)  # unreachable after start


class EngineConfig(_Strict):
    kind: Literal["auto", "vllm", "remote", "tesseract", "simulated"] = "auto"
    # Hugging Face id or local path (vllm); served model name (remote).
    model: str = DEFAULT_MODEL
    # remote: base URLs of OpenAI-compatible servers, e.g. http://gpu1:8000/v1
    urls: list[str] = Field(default_factory=list)
    # remote: the servers' API key, inline, or (better) from a file or a systemd
    # credential (ocrd/credentials.py); at most one of the three
    api_key: str | None = None
    api_key_file: Path | None = None
    api_key_credential: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.@-]+$")
    # remote, https servers: trust only this CA bundle (PEM) instead of the system's, and
    # show this client certificate (PEM; its key in tls_key_file or in the same file)
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # remote: pages each server decodes at once (its batch: `vllm serve --max-num-seqs`)
    concurrency_per_url: int = Field(default=32, ge=1)
    # remote: pages sent to each server beyond its batch, to wait in its queue, so that a
    # place freed in the batch is refilled at the server's next step, not a round trip
    # later (issue 14.7); 0 for a server that refuses more than its batch
    queue_per_url: int = Field(default=2, ge=0)
    request_timeout_seconds: float = Field(default=600.0, gt=0)
    max_tokens: int = Field(default=8192, ge=1)
    # a page whose output ends for length/repetition is retried this many extra times
    # with tighter anti-repetition settings
    loop_retries: int = Field(default=1, ge=0)
    ngram: NGramConfig = Field(default_factory=NGramConfig)
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    tesseract: TesseractConfig = Field(default_factory=TesseractConfig)
    simulated: SimulatedConfig = Field(default_factory=SimulatedConfig)
    # TESTING ONLY (reliability tests; see TestingFaultsConfig): null in production
    testing_faults: TestingFaultsConfig | None = None

    @model_validator(mode="after")
    def _remote_needs_urls(self) -> EngineConfig:
        if self.kind == "remote" and not self.urls:
            raise ValueError("kind is 'remote' but 'urls' is empty")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"url {url!r} must start with http:// or https://")
        given = [k for k, v in (("api_key", self.api_key), ("api_key_file", self.api_key_file),
                                ("api_key_credential", self.api_key_credential)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} are both set; give the key one way")
        if self.tls_key_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_key_file is set without tls_cert_file (the client "
                             "certificate it belongs to)")
        return self
