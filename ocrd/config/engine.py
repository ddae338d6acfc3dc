"""The `engine:` section of the configuration (config/settings.py reads the whole file): which
engine, and the settings of each kind. Unknown keys are errors here too.

Each key's text is written once, in its `description`: docs/configuration.md and
config.example.yaml are generated from these models (ocrd/config/reference.py).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

DEFAULT_MODEL = "deepseek-ai/DeepSeek-OCR-2"
# The page-markdown recipe's question (olmOCR's way: Markdown after a YAML front matter
# that says how the page lies), in ocrd's words.
DEFAULT_PAGE_PROMPT = (
    "This image is one page of a document. Write out all of its text as Markdown, in the "
    "order a person reads it: headings as headings, lists as lists, tables as HTML "
    "tables, equations in LaTeX. Leave out nothing and add nothing. Begin with a YAML "
    "front matter that gives primary_language, is_rotation_valid and "
    "rotation_correction (0, 90, 180 or 270: the clockwise turn that would make the page "
    "upright).")

class _Strict(BaseModel):
    """Every configuration section: unknown keys are errors, defaults validated too."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


def key_problem(key: str, message: str) -> PydanticCustomError:
    """An error of a section's validator about one of its keys (`key`, relative to the
    section): check-config names that key, and leaves it out to look for more."""
    return PydanticCustomError("ocrd_key", "{message}", {"key": key, "message": message})


class TesseractConfig(_Strict):
    """The CPU engine: the `tesseract` program, once per page."""

    lang: str = Field("eng", description=(
        "Languages of the text, as tesseract names them: `eng`, or several joined with "
        "`+` (`eng+deu`). Each needs its language data: `apt-get install "
        "tesseract-ocr-deu`."))
    psm: int = Field(3, ge=0, le=13, description=(
        "tesseract's page segmentation mode; 3 finds the page's layout by itself (a page "
        "in Korean whose text that layout leaves unread is read again as one column, "
        "mode 4, and the better reading kept)."))
    workers: int = Field(0, ge=0, description=(
        "tesseract processes at once; 0: one per CPU core."))
    timeout_seconds: float = Field(300.0, gt=0, description=(
        "Seconds one page may take; a page that takes longer counts as an engine error."))
    orientation: bool = Field(True, description=(
        "A page read with little confidence (upside down) or read top to bottom "
        "(sideways) is checked with tesseract's orientation detection (on a page of few "
        "words, on its text region), turned and read again; the sidecar records each "
        "page's turn as `rotation`. Needs `apt-get install tesseract-ocr-osd`."))
    orientation_confidence: float = Field(5.0, ge=0, description=(
        "The orientation detection's confidence below which a page is read as it lies."))


class NGramConfig(_Strict):
    """DeepSeek-OCR-2's guard against repeated text (per page): an n-gram that already
    occurred within the window may not be generated again."""

    ngram_size: int = Field(30, ge=1, description="Tokens in one n-gram.")
    window_size: int = Field(90, ge=1, description="Tokens looked back over.")
    whitelist_token_ids: list[int] = Field(
        default_factory=lambda: [128821, 128822], description=(
            "Tokens that may repeat freely (`<td>`, `</td>`: table cells)."))


class VllmConfig(_Strict):
    """DeepSeek-OCR-2 in vLLM on this machine's GPUs (`engine.kind: vllm`, or `auto`
    with a CUDA GPU). docs/gpu.md explains the settings, "One big GPU" first."""

    profile: Literal["auto", "none"] = Field("auto", description=(
        "`auto`: the layout measured for the GPUs ocrd finds (README, \"Your GPU → what "
        "ocrd runs\"), logged at start as `vllm_profile`; every key set here overrides "
        "the profile's value. `none`: the keys set here and their defaults."))
    mode: Literal["inprocess", "managed"] | None = Field(None, description=(
        "`inprocess`: the engine runs inside ocrd. `managed`: ocrd starts and supervises "
        "local `vllm serve` processes and sends them the pages over HTTP (for several "
        "front ends, servers per GPU, several GPUs: api_servers, servers_per_gpu, gpus). "
        "null: the profile's."))
    dtype: str = Field("bfloat16", description=(
        "The model's weights' type; lower precision costs accuracy."))
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description=(
        "Share of each GPU's memory vLLM may take (all managed servers of a GPU "
        "together)."))
    max_model_len: int = Field(8192, ge=256, description=(
        "Longest prompt plus output, in tokens."))
    max_num_seqs: int = Field(100, ge=1, description=(
        "Pages decoded at once, per engine (per managed server)."))
    max_num_batched_tokens: int = Field(16384, ge=0, description=(
        "Tokens one engine step may take in: one per page being decoded, plus the "
        "images and prompts of new pages; 0: vLLM's default."))
    tensor_parallel_size: int = Field(1, ge=1, description=(
        "GPUs one model is split across."))
    data_parallel_size: int = Field(1, ge=1, description=(
        "Copies of the model one server runs, each on its own GPUs."))
    api_servers: int = Field(1, ge=1, description=(
        "Managed mode: front-end processes that prepare page images (resize, tiles), per "
        "GPU (`vllm serve --api-server-count N`); one front end is one CPU thread and "
        "prepares only a few pages a second."))
    server_port: int = Field(0, ge=0, le=65535, description=(
        "Managed mode: the first server's port on 127.0.0.1 (further servers take the "
        "next ports); 0: free ports."))
    servers_per_gpu: int = Field(1, ge=1, le=16, description=(
        "Managed servers on each GPU (or group of tensor_parallel_size × "
        "data_parallel_size GPUs), each with its own engine core, an equal share of "
        "gpu_memory_utilization and of api_servers (at least 1 each); ocrd sends each "
        "page to the server with the fewest pages in flight. One engine core cannot "
        "keep a large GPU busy."))
    mps: bool | None = Field(None, description=(
        "Managed mode: CUDA MPS for the servers of a GPU, so that their kernels run side "
        "by side instead of in turns (ocrd starts and stops one `nvidia-cuda-mps-control` "
        "per GPU group). null: where servers share a GPU and the program is found, else "
        "a warning; true: for every group, and the daemon stops if MPS cannot start; "
        "false: never."))
    queue_per_server: int | None = Field(None, ge=0, description=(
        "Managed mode: pages sent to each server beyond its batch (max_num_seqs), to "
        "wait in its queue already prepared; null: 4 per front end. The queue goes by "
        "priority (the pages of a short document before a long one's)."))
    gpus: list[int] = Field(default_factory=list, description=(
        "Managed mode on these CUDA devices (as nvidia-smi numbers them): one group of "
        "servers per tensor_parallel_size × data_parallel_size devices. []: the devices "
        "ocrd's environment shows, as one group."))
    fast_encoder: bool = Field(True, description=(
        "ocrd's own path through DeepSeek-OCR-2's vision encoder (the same weights and "
        "results, less work per page). Needs ocrd installed with pip (vLLM loads it "
        "as a plugin); without it vLLM's own code runs."))
    batch_encoder: bool | None = Field(None, description=(
        "With fast_encoder: the pages of an engine step are encoded together, in padded "
        "calls of a few sizes. null: on where the model runs on a GPU; false: vLLM's "
        "shapes, page by page (the very embeddings vLLM's own code makes)."))
    uint8_pixels: bool = Field(True, description=(
        "With fast_encoder: page images travel to the engine core as bytes and are "
        "normalised on the GPU, into the very values vLLM's processor makes (half the "
        "data to copy); false: vLLM's float images."))
    engine_args: dict[str, Any] = Field(default_factory=dict, description=(
        "Further vLLM engine arguments, passed through as they are (`{enforce_eager: "
        "true}`); in the managed mode they become `vllm serve` flags "
        "(`--enforce-eager`)."))

    @model_validator(mode="after")
    def _gpu_groups(self) -> VllmConfig:
        per = self.tensor_parallel_size * self.data_parallel_size
        if len(set(self.gpus)) != len(self.gpus) or any(g < 0 for g in self.gpus):
            raise key_problem("gpus", "each device once, numbers >= 0")
        if self.gpus and len(self.gpus) % per:
            raise key_problem("gpus", f"{len(self.gpus)} devices do not split into groups "
                              f"of tensor_parallel_size × data_parallel_size = {per}")
        if self.mode == "inprocess":
            managed_only = {"api_servers": self.api_servers > 1,
                            "servers_per_gpu": self.servers_per_gpu > 1, "gpus": self.gpus}
            for key, used in managed_only.items():
                if used:
                    raise key_problem(key, f"{key} {getattr(self, key)} needs mode: managed "
                                      "(the engine inside ocrd has one front end on one GPU)")
        if self.server_port and self.server_port + self.server_count - 1 > 65535:
            raise key_problem("server_port", f"the {self.server_count} managed servers' "
                              "ports would pass 65535")
        return self

    @property
    def server_count(self) -> int:
        """Managed `vllm serve` processes: servers_per_gpu per group of GPUs."""
        per = self.tensor_parallel_size * self.data_parallel_size
        return max(1, len(self.gpus) // per) * self.servers_per_gpu

    @property
    def managed(self) -> bool:
        """ocrd starts and supervises local `vllm serve` processes (ocrd/engines/vllm/managed.py)
        instead of running the engine inside its own process (mode, once resolved)."""
        return self.mode == "managed"


# The engines by name: what `engine.kind` may say besides a class path of one's own
# (`package.module:Class`, an ocrd.engines.base.Engine subclass). `auto` is a choice among
# these, made at start.
ENGINES: dict[str, str] = {
    "tesseract": "ocrd.engines.tesseract:TesseractEngine",
    "remote": "ocrd.engines.remote:RemoteEngine",
    "vllm": "ocrd.engines.vllm.inprocess:VllmEngine",  # or managed servers: its create()
}
# How a model on `vllm serve` is asked for a page and how its answer is read: what
# `engine.recipe` may say besides a class path of one's own (a Recipe subclass).
RECIPES: dict[str, str] = {
    "deepseek-ocr-2": "ocrd.engines.deepseek_ocr2:DeepSeekOcr2",
    "page-markdown": "ocrd.engines.page_markdown:PageMarkdown",
}
CLASS_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
# Keys that moved into a section of their own: old place -> new place (both under
# `engine`). The old place is still read, with a note saying where the key lives now.
MOVED: dict[str, tuple[str, str]] = {
    **{key: ("remote", key) for key in (
        "urls", "api_key", "api_key_file", "api_key_credential", "tls_ca_file",
        "tls_cert_file", "tls_key_file", "concurrency_per_url", "queue_per_url",
        "request_timeout_seconds")},
    "ngram": ("deepseek_ocr2", "ngram"),
}


def moved_keys(engine: Any) -> tuple[Any, list[str]]:
    """The engine section with keys from their old places moved into their sections,
    and a note for each (a key given in both places stays, and is refused as unknown)."""
    if not isinstance(engine, dict):
        return engine, []
    engine = dict(engine)
    notes = []
    for old, (section, key) in MOVED.items():
        if old not in engine:
            continue
        into = engine.get(section)
        if into is None:
            into = {}
        if not isinstance(into, dict) or key in into:
            continue
        engine[section] = {**into, key: engine.pop(old)}
        notes.append(f"engine.{old} is now engine.{section}.{key}; the old place is still "
                     f"read, but move it: `{section}:` with `{key}:` under it")
    return engine, notes


def _close(given: str, names: list[str]) -> str:
    close = difflib.get_close_matches(given, names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class RemoteConfig(_Strict):
    """OpenAI-compatible `vllm serve` servers that read the pages (`engine.kind: remote`):
    where they are, how to reach them, how many pages each takes. What the model is asked
    and how its answer is read: `engine.recipe`."""

    urls: list[str] = Field(default_factory=list, description=(
        "The servers' base URLs (`http://gpu1:8000/v1`); pages are spread across them. "
        "Proxies come from the environment (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`; "
        "`/etc/default/ocrd` for the service)."))
    api_key: str | None = Field(None, description=(
        "The servers' API key (`vllm serve --api-key`), sent as `Authorization: Bearer "
        "…`. Better kept out of this file: api_key_file or api_key_credential; give it "
        "one way only."))
    api_key_file: Path | None = Field(None, description=(
        "A file holding the API key, readable by ocrd's user alone (`/etc/ocrd/api-key`)."))
    api_key_credential: str | None = Field(None, pattern=r"^[A-Za-z0-9_.@-]+$", description=(
        "The name of a systemd credential holding the API key "
        "(`LoadCredential=NAME:/etc/ocrd/api-key` in the unit; read from "
        "`$CREDENTIALS_DIRECTORY/NAME`)."))
    tls_ca_file: Path | None = Field(None, description=(
        "`https://` servers: trust this CA bundle (PEM) alone instead of the system's CAs "
        "(a company's own CA)."))
    tls_cert_file: Path | None = Field(None, description=(
        "A client certificate (PEM) for servers that ask for one; its private key in the "
        "same file or in tls_key_file."))
    tls_key_file: Path | None = Field(None, description=(
        "The client certificate's private key (PEM, unencrypted: readable by ocrd's user "
        "alone)."))
    concurrency_per_url: int = Field(32, ge=1, description=(
        "Pages each server decodes at once: its batch (`vllm serve --max-num-seqs`)."))
    queue_per_url: int = Field(2, ge=0, description=(
        "Pages sent to each server beyond its batch, to wait in its queue, so that a "
        "place freed in the batch is refilled at once; 0 for a server that refuses more "
        "than its batch."))
    request_timeout_seconds: float = Field(600.0, gt=0, description=(
        "Seconds before one request is given up (and retried)."))

    @model_validator(mode="after")
    def _addresses_and_keys(self) -> RemoteConfig:
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise key_problem("urls", f"{url!r} must start with http:// or https://")
        given = [k for k, v in (("api_key", self.api_key), ("api_key_file", self.api_key_file),
                                ("api_key_credential", self.api_key_credential)) if v is not None]
        if len(given) > 1:
            raise key_problem(given[-1], f"{' and '.join(given)} are both set; give the key "
                              "one way")
        if self.tls_key_file is not None and self.tls_cert_file is None:
            raise key_problem("tls_key_file", "tls_key_file is set without tls_cert_file "
                              "(the client certificate it belongs to)")
        return self


class DeepSeekOcr2Config(_Strict):
    """DeepSeek-OCR-2's own settings (`engine.recipe: deepseek-ocr-2`, and the vllm
    engine, which runs that model)."""

    ngram: NGramConfig = Field(default_factory=NGramConfig)


class PageMarkdownConfig(_Strict):
    """A vision-language model that answers a page image with its Markdown
    (`engine.recipe: page-markdown`): olmOCR, Nanonets-OCR, Qwen2.5-VL and the like on
    `vllm serve`. docs/engines.md, "Bring your own model"."""

    prompt: str = Field(DEFAULT_PAGE_PROMPT, min_length=1, description=(
        "What the model is asked, beside the page's image. The default asks for Markdown "
        "with a front matter that says whether the page lies turned (olmOCR's format); "
        "a model trained on another prompt wants its own here."))
    system_prompt: str | None = Field(None, description=(
        "A system message before the page, for models that expect one."))
    temperature: float = Field(0.0, ge=0, le=2, description=(
        "Sampling temperature of the first try; each retry of a page that loops adds "
        "`retry_temperature_step`."))
    retry_temperature_step: float = Field(0.2, ge=0, le=1, description=(
        "Added to the temperature on each retry of a page whose answer ran into a loop."))
    front_matter: bool = Field(True, description=(
        "Read a YAML front matter at the start of the answer (`---` … `---`: olmOCR's "
        "`primary_language`, `is_rotation_valid`, `rotation_correction`) and leave it "
        "out of the Markdown."))
    turn_pages: bool = Field(True, description=(
        "When the front matter says the page lies turned, ask again with the page turned "
        "as it says (once); the sidecar records the turn as `rotation`."))


class EngineConfig(_Strict):
    """What reads the pages."""

    kind: str = Field("auto", description=(
        "`auto`: vllm when vLLM is installed and a CUDA GPU is present, else tesseract. "
        "`vllm`: DeepSeek-OCR-2 on this machine's GPU (`pip install "
        "'ocr-inbox-daemon[vllm]'`). `remote`: OpenAI-compatible `vllm serve` servers "
        "(`engine.remote`), asked as `engine.recipe` says. `tesseract`: the CPU engine "
        "(`apt-get install tesseract-ocr tesseract-ocr-eng tesseract-ocr-osd`). Or an "
        "engine of your own, by class path: `package.module:Class` (its settings in "
        "`engine.options`; docs/engines.md)."))
    model: str = Field(DEFAULT_MODEL, description=(
        "vllm: the model's Hugging Face id or local folder. remote: the served model's "
        "name (`vllm serve --served-model-name`)."))
    recipe: str = Field("deepseek-ocr-2", description=(
        "How the model is asked for a page and how its answer is read (remote; vllm "
        "runs deepseek-ocr-2 only). `deepseek-ocr-2`: DeepSeek-OCR-2's prompt, sampling, "
        "n-gram ban and layout tags (`engine.deepseek_ocr2`). `page-markdown`: a model "
        "that answers a page image with its Markdown, such as olmOCR "
        "(`engine.page_markdown`). Or a recipe of your own: `package.module:Class`."))
    max_tokens: int = Field(8192, ge=1, description="Most tokens generated for one page.")
    loop_retries: int = Field(1, ge=0, description=(
        "A page whose output ends for length or repetition (a loop) is read again this "
        "many times with stricter settings (the recipe's); the best text is kept and the "
        "page flagged in the sidecar."))
    remote: RemoteConfig = Field(default_factory=RemoteConfig)
    deepseek_ocr2: DeepSeekOcr2Config = Field(default_factory=DeepSeekOcr2Config)
    page_markdown: PageMarkdownConfig = Field(default_factory=PageMarkdownConfig)
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    tesseract: TesseractConfig = Field(default_factory=TesseractConfig)
    options: dict[str, Any] = Field(default_factory=dict, description=(
        "The settings of an engine given by class path (`kind: package.module:Class`), "
        "checked by its own `Options` model where it has one."))

    @model_validator(mode="before")
    @classmethod
    def _old_places(cls, data: Any) -> Any:
        return moved_keys(data)[0]

    @model_validator(mode="after")
    def _kind_and_recipe(self) -> EngineConfig:
        if self.kind != "auto" and self.kind not in ENGINES and \
                not CLASS_PATH.fullmatch(self.kind):
            raise key_problem("kind", "not an engine: one of " + ", ".join(["auto", *ENGINES])
                              + ", or an engine's class path `package.module:Class`"
                              + _close(self.kind, ["auto", *ENGINES]))
        if self.recipe not in RECIPES and not CLASS_PATH.fullmatch(self.recipe):
            raise key_problem("recipe", "not a recipe: one of " + ", ".join(RECIPES)
                              + ", or a recipe's class path `package.module:Class`"
                              + _close(self.recipe, list(RECIPES)))
        if self.kind == "remote" and not self.remote.urls:
            raise key_problem("kind", "'remote' needs the servers' addresses in "
                              "engine.remote.urls")
        if self.kind == "vllm" and self.recipe != "deepseek-ocr-2":
            raise key_problem("recipe", f"{self.recipe!r}: the vllm engine runs "
                              "DeepSeek-OCR-2 (deepseek-ocr-2); a model of another kind runs "
                              "on `vllm serve` with kind: remote")
        if self.options and not CLASS_PATH.fullmatch(self.kind):
            raise key_problem("options", "options are for an engine given by class path "
                              f"(kind: package.module:Class), not for {self.kind!r}")
        return self
