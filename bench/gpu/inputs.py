"""The GPU benchmark's inputs: a full-size DeepSeek-OCR-2 config with dummy weights and a
full tokenizer, and document-like A4 pages (as PDFs for the daemon, as PNG data URLs
for a direct client), each page different.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

from bench.gpu.common import A4, VOCAB


def build_model(out: Path) -> Path:
    """Full-size DeepSeek-OCR-2 config (as deepseek-ai/DeepSeek-OCR-2, no head_dim: the
    guard must supply it) and a tokenizer with all 129,280 ids, so that generated ids
    detokenize like real ones (the CPU tests' tokenizer has ~400)."""
    from transformers import LlamaTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    bos, eos, unk, pad = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<unk>",
                          "<｜▁pad▁｜>")
    special = ["<image>", "<|grounding|>", "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>"]
    vocab = {unk: 0, bos: 1, eos: 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in ["▁"] + [chr(c) for c in range(33, 127)]:
        vocab.setdefault(ch, len(vocab))
    i = 0
    while len(vocab) < VOCAB - 1 - len(special):
        vocab[f"▁w{i}"] = len(vocab)
        i += 1
    tok = LlamaTokenizerFast(vocab=vocab, merges=[], bos_token=bos, eos_token=eos,
                             unk_token=unk, add_bos_token=True, add_eos_token=False,
                             legacy=False, add_prefix_space=False)
    tok.add_special_tokens({"pad_token": pad, "additional_special_tokens": special})
    tok.model_max_length = 8192
    assert len(tok) == VOCAB, len(tok)
    tok.save_pretrained(str(out))
    text = full_size_text_config()
    config = {
        "architectures": ["DeepseekOCR2ForCausalLM"], "model_type": "deepseek_vl_v2",
        "candidate_resolutions": [[1024, 1024]], "global_view_pos": "head",
        "tile_tag": "2D", "language_config": text,
        "projector_config": {"model_type": "mlp_projector", "projector_type": "linear",
                             "input_dim": 896, "n_embed": 1280},
        "vision_config": {"image_size": 1024, "model_type": "vision", "width": 896},
        "vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def full_size_text_config() -> dict[str, Any]:
    """DeepSeek-OCR-2's language model as its config.json has it (12 layers, 64 routed
    experts 896 wide, 6 per token): the decoder the GPU benchmark runs with dummy weights,
    and the shape ocrd's tuned fused-MoE tiles are for (ocrd/vllm_model/moe_configs/)."""
    return {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "vocab_size": VOCAB, "hidden_size": 1280, "intermediate_size": 6848,
        "moe_intermediate_size": 896, "num_hidden_layers": 12, "num_attention_heads": 10,
        "num_key_value_heads": 10, "kv_lora_rank": None, "q_lora_rank": None,
        "qk_nope_head_dim": 0, "qk_rope_head_dim": 0, "v_head_dim": 0, "use_mla": False,
        "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "topk_method": "greedy",
        "n_group": 1, "topk_group": 1, "norm_topk_prob": False,
        "routed_scaling_factor": 1.0, "scoring_func": "softmax",
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "attention_bias": False, "bos_token_id": 1,
        "eos_token_id": 2, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def page_image(seed: int, size: tuple[int, int] = A4) -> Any:
    """A document-like page: dark 'words' on lines, with a unique stamp per seed."""
    import numpy as np
    from PIL import Image, ImageDraw

    w, h = size
    rng = np.random.default_rng(seed % 64)
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    s = w / A4[0]
    y = int(80 * s)
    while y < h - 80 * s:
        x = int(80 * s)
        while x < w - 120 * s:
            ww = int(rng.integers(20, 110) * s)
            d.rectangle([x, y, x + ww, y + int(14 * s)],
                        fill=tuple(int(v) for v in rng.integers(0, 90, 3)))
            x += ww + int(rng.integers(8, 20) * s)
        y += int((24 + int(rng.integers(0, 10))) * s)
    d.rectangle([8, 8, 72, 40], fill=(seed % 251, (seed // 251) % 251, 7))
    d.rectangle([w - 72, h - 40, w - 8, h - 8], fill=(200, seed % 241, (seed // 241) % 241))
    return img


def _write_pdf(job: tuple[str, list[int]]) -> str:
    path, seeds = job
    pages = [page_image(s) for s in seeds]
    pages[0].save(path, "PDF", save_all=True, append_images=pages[1:], resolution=144.0)
    return path


def make_pdfs(folder: Path, n_pages: int, per_file: int, seed0: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    jobs = []
    for k, first in enumerate(range(0, n_pages, per_file)):
        seeds = [seed0 + first + j for j in range(min(per_file, n_pages - first))]
        jobs.append((str(folder / f"doc{seed0}_{k:04d}.pdf"), seeds))
    with multiprocessing.Pool(min(16, os.cpu_count() or 2)) as pool:
        return [Path(p) for p in pool.map(_write_pdf, jobs)]


def _data_url(job: tuple[int, tuple[int, int]]) -> str:
    import io

    import pypdfium2 as pdfium

    from ocrd.engines.remote import image_data_url

    # through a PDF as make_pdfs writes it (the page as JPEG), rendered at 144 dpi as
    # ocrd renders the PDFs it is given: the same kind of pixels as ocrd's pages (round
    # 8 and before: the page image itself, whose PNG is a twentieth of the size and
    # decodes in a fraction of the time)
    buf = io.BytesIO()
    page_image(job[0], job[1]).save(buf, "PDF", resolution=144.0)
    doc = pdfium.PdfDocument(buf.getvalue())
    try:
        image = doc[0].render(scale=144 / 72).to_pil()
    finally:
        doc.close()
    return image_data_url(image)


def data_urls(seeds: range, size: tuple[int, int] = A4) -> list[str]:
    """Pages as ocrd sends them (PNG data URLs of the pages of PDFs like make_pdfs's,
    rendered at 144 dpi), made before any timing."""
    with multiprocessing.Pool(min(16, os.cpu_count() or 2)) as pool:
        return pool.map(_data_url, [(s, size) for s in seeds])
