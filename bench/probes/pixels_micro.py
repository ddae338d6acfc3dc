"""CPU cost of an A4 page's views on their way to the engine core: vLLM's float views
against ocrd's uint8 views (ocrd/vllm_model/dsocr2_pixels.py), side by side, interleaved.

    PYTHONPATH=$PWD .venv/bin/python bench/probes/pixels_micro.py [--rounds 5] [--pages 16]

Per A4 page at 144 dpi (a rendered text page, 2×3 tiles): the front end's processor
(vLLM's DeepseekOCRProcessor through vLLM's processing context, its cast to bf16
included), vLLM's msgpack encoding (front end) and decoding (engine core's input thread)
of the views, and the engine core's stacking of a step's pages into one tensor (as
`MultiModalBatchedField/FlatField._reduce_data` do; pinned memory only where there is a
GPU). Prints each as ms per page and the ratio uint8 ÷ float (< 1: uint8 cheaper), and
the bytes per page. Needs vLLM (the tests' CPU build does).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pages", type=int, default=16, help="pages per engine step")
    args = p.parse_args(argv)

    import tempfile

    import torch
    from helpers import sentence_lines, text_image
    from vllm.transformers_utils.processors.deepseek_ocr import DeepseekOCRProcessor
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
    from vllm_engine.tiny_model import build

    from ocrd.vllm_model.dsocr2_pixels import _uint8_copy

    with tempfile.TemporaryDirectory() as tmp:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(build(Path(tmp)))
    vllms = DeepseekOCRProcessor(tokenizer, image_size=768, base_size=1024, strategy="v2")
    procs = {"float": vllms, "uint8": _uint8_copy(vllms)}
    page = text_image(sentence_lines(1, 40), (1191, 1684)).convert("RGB")
    pin = torch.cuda.is_available()
    enc, dec = MsgpackEncoder(), MsgpackDecoder(dict[str, torch.Tensor])

    def views(kind: str) -> dict[str, Any]:
        out = procs[kind](prompt="<image>\nFree OCR.", images=[page])
        return {k: (v.to(torch.bfloat16) if v.is_floating_point() else v)  # vLLM's cast
                for k, v in out.items() if k in ("pixel_values", "images_crop")}

    timings: dict[str, dict[str, list[float]]] = {
        k: {"processor": [], "msgpack": [], "stack": []} for k in procs}
    nbytes: dict[str, int] = {}
    for _ in range(args.rounds):
        for kind in procs:  # interleaved: float, uint8, float, uint8, ...
            t0 = time.perf_counter()
            v = views(kind)
            t1 = time.perf_counter()
            nbytes[kind] = sum(x.numel() * x.element_size() for x in v.values())
            back = dec.decode(enc.encode(v))
            t2 = time.perf_counter()
            step = [back] * args.pages
            for key in ("pixel_values", "images_crop"):
                parts = [s[key] for s in step]
                out = parts[0].new_empty((sum(x.shape[0] for x in parts), *parts[0].shape[1:]),
                                         pin_memory=pin)
                torch.cat(parts, out=out)
            t3 = time.perf_counter()
            timings[kind]["processor"].append((t1 - t0) * 1e3)
            timings[kind]["msgpack"].append((t2 - t1) * 1e3)
            timings[kind]["stack"].append((t3 - t2) * 1e3 / args.pages)
    print(f"A4 page at 144 dpi, {args.rounds} rounds, {args.pages} pages per step, "
          f"pinned={pin}; median ms per page")
    print("| part | float | uint8 | uint8 ÷ float |")
    print("|---|---|---|---|")
    for part in ("processor", "msgpack", "stack"):
        f = statistics.median(timings["float"][part])
        u = statistics.median(timings["uint8"][part])
        print(f"| {part} | {f:.1f} | {u:.1f} | {u / f:.2f} |")
    print(f"| bytes per page | {nbytes['float']:,} | {nbytes['uint8']:,} | "
          f"{nbytes['uint8'] / nbytes['float']:.2f} |")


if __name__ == "__main__":
    main()
