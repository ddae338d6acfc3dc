"""Writes a tiny DeepSeek-OCR-2 model folder (config + tokenizer, no weights) for vLLM tests.

vLLM loads it with `load_format="dummy"`, which fills every tensor with generated values,
so nothing is downloaded and nothing large is stored. The architecture is vLLM's own
`DeepseekOCR2ForCausalLM` with a 2-layer MoE language model (hidden 128, 4 heads: the CPU
attention kernels need head_dim 32 or more). The vision tower's sizes are hard-coded in
vLLM; the test plugin (plugin/tiny_vision_patch.py) shrinks it to `TINY_VISION_DIM`.
"""

from __future__ import annotations

import json
from pathlib import Path

# Width of the shrunk vision tower (plugin) and of vLLM's real one.
TINY_VISION_DIM = 64
REAL_VISION_DIM = 896
HIDDEN = 128
NUM_HEADS = 4

BOS, EOS, UNK, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<unk>", "<｜▁pad▁｜>"
SPECIAL_TOKENS = ["<image>", "<|grounding|>", "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>"]


def _tokenizer(out: Path) -> int:
    """A Llama-style BPE tokenizer with byte fallback (any text encodes); returns its size."""
    from transformers import LlamaTokenizerFast

    vocab: dict[str, int] = {UNK: 0, BOS: 1, EOS: 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in ["▁"] + [chr(c) for c in range(33, 127)]:
        vocab.setdefault(ch, len(vocab))
    # Fill up with Latin-1 letters so that the vocabulary (with the special tokens added
    # below) is a multiple of 64: the model's padded rows then all decode to text, even
    # when random weights pick them.
    extra = -(len(vocab) + 1 + len(SPECIAL_TOKENS)) % 64
    for c in range(0xC0, 0xC0 + extra):
        vocab[chr(c)] = len(vocab)
    tok = LlamaTokenizerFast(
        vocab=vocab, merges=[], bos_token=BOS, eos_token=EOS, unk_token=UNK,
        add_bos_token=True, add_eos_token=False, legacy=False, add_prefix_space=False)
    tok.add_special_tokens({"pad_token": PAD, "additional_special_tokens": SPECIAL_TOKENS})
    tok.model_max_length = 8192
    tok.save_pretrained(str(out))
    return len(tok)


def build(out: Path, vision_dim: int = TINY_VISION_DIM) -> Path:
    """Write config.json and the tokenizer files into `out` and return it."""
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = _tokenizer(out)
    padded_vocab = (vocab_size + 63) // 64 * 64
    assert padded_vocab == vocab_size, "every row of the embedding must be a real token"
    # DeepSeek-OCR-2's language model is DeepSeek-3B-MoE with plain multi-head attention
    # (no MLA): the same zero qk_*_head_dim fields as the real checkpoint, which is what
    # makes transformers 5 report head_dim 0 (see ocrd/engines/vllm/inprocess.py).
    language_config = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "vocab_size": padded_vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_HEADS,
        "kv_lora_rank": None,
        "q_lora_rank": None,
        "qk_nope_head_dim": 0,
        "qk_rope_head_dim": 0,
        "v_head_dim": 0,
        "use_mla": False,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": False,
        "routed_scaling_factor": 1.0,
        "scoring_func": "softmax",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    config = {
        "architectures": ["DeepseekOCR2ForCausalLM"],
        "model_type": "deepseek_vl_v2",
        "candidate_resolutions": [[1024, 1024]],
        "global_view_pos": "head",
        "tile_tag": "2D",  # vLLM's processor requires it
        "language_config": language_config,
        # vision features (width vision_dim) -> linear projector -> LM hidden size
        "projector_config": {"model_type": "mlp_projector", "projector_type": "linear",
                             "input_dim": vision_dim, "n_embed": HIDDEN},
        # vLLM reads only image_size; the encoder shapes are hard-coded there
        "vision_config": {"image_size": 1024, "model_type": "vision", "width": 896},
        "vocab_size": padded_vocab,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-dsocr2")))
