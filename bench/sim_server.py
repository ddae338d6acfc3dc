"""A simulated `vllm serve`: ocrd's SimulatedEngine (a continuous-batching engine with the
model replaced by a clock: `max_batch` pages decoded per step, the rest queued) behind
vLLM's OpenAI-compatible routes, `/v1/models` and `/v1/chat/completions`, on 127.0.0.1.

The remote engine's benchmarks run it as a subprocess, so that its stepping loop and
HTTP handling do not share a process (or a GIL) with the client being measured:

    python -m bench.sim_server --max-batch 16 --decode-steps 24   # prints "port N"

A page's decode length comes from its image (a hash of the data URL), so the same page
costs the same however it reaches the server.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import io
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

MODEL = "deepseek-ai/DeepSeek-OCR-2"


def build_app(sim: dict):
    from PIL import Image
    # the simulated engine lives with the tests (tests/simulated_engines.py)
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from simulated_engines import SIMULATED, SimulatedEngine
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from ocrd.config.settings import EngineConfig
    from ocrd.engines.base import PageRequest

    engine = SimulatedEngine(EngineConfig.model_validate({"kind": SIMULATED, "options": sim}))
    served = {"n": 0}

    async def models(_: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def chat(request: Request) -> JSONResponse:
        payload = await request.json()
        url = payload["messages"][0]["content"][0]["image_url"]["url"]
        data = url.split(",", 1)[1]
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        image.load()
        doc_id = hashlib.blake2b(data.encode(), digest_size=8).hexdigest()
        out = await engine.ocr(PageRequest(image=image, page_no=1, doc_id=doc_id))
        served["n"] += 1
        return JSONResponse({
            "id": f"chatcmpl-{served['n']}", "object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": out.text}}],
            "usage": {"prompt_tokens": 1146, "completion_tokens": out.tokens,
                      "total_tokens": 1146 + out.tokens}})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.close()

    return Starlette(routes=[Route("/v1/models", models),
                             Route("/v1/chat/completions", chat, methods=["POST"])],
                     lifespan=lifespan)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--decode-steps", type=int, default=24)
    ap.add_argument("--step-seconds", type=float, default=0.02)
    args = ap.parse_args(argv)
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"port {sock.getsockname()[1]}", flush=True)
    app = build_app({"max_batch": args.max_batch, "decode_steps": args.decode_steps,
                     "step_seconds": args.step_seconds})
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", backlog=1024,
                                           timeout_keep_alive=30))
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
