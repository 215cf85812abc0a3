"""The embedded `v41-tiny` model: a V4.1 as wide as `tiny` (hidden 128, 4 heads of 64) with every
part of the architecture present: sliding-only layers, encoder ratio-2 CSA2 (Full, Reindex,
Reuse), the decoder's ratio-1 CSA2 (Full at the boundary and candidate source, Reuse, Reindex
inside the candidate pool), Engram, and a DSpark stage. Seeded random weights, written on first
use under $DEEPRING_CACHE_DIR/v41-tiny-<hash>/ with the V4.1 tokenizer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from deepring import env
from deepring.model.presets import v41_positions, v41_quantization
from deepring.protocol.tokenizer import write_v41_tokenizer

TINY_SEED = 0
TINY_FORMAT = 1  # bump when the generator below changes

V41_TINY_CONFIG: dict = {
    "model_type": "deepseek_v41",
    "architectures": ["DeepseekV41ForCausalLM"],
    "dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "image_token_id": 129264,
    "text_config": {
        "vocab_size": 129281,  # the V4.1 tokenizer: 129280 V4 ids + <｜System｜>
        "hidden_size": 128,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "qk_rope_head_dim": 16,
        "q_lora_rank": 64,
        "o_lora_rank": 32,
        "o_groups": 2,
        **v41_positions(),
        "compress_ratios": [0, 0, 2, 2, 1, 1, 1, 1, 0],
        "kv_source_layer_ids": [2, 4],
        "index_source_layer_ids": [2, 3, 4, 6],
        "candidate_source_layer_id": 4,
        "candidate_topk_blocks": 16,
        "candidate_block_size": 8,
        "index_topk": 64,
        "index_n_heads": 8,
        "index_head_dim": 32,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": True,
        "topk_method": "noaux_tc",
        "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0,
        "hc_mult": 4,
        "hc_eps": 1e-6,
        "hc_sinkhorn_iters": 20,
        "hc_shifted": True,
        "rms_norm_eps": 1e-6,
        "engram_layer_ids": [1],
        "engram_max_ngram_size": 3,
        "engram_vocab_size": 4099,
        "engram_n_heads": 2,
        "engram_head_dim": 32,
        "engram_compressed_vocab_size": None,
        "engram_pad_token_id": 2,
        "num_nextn_predict_layers": 1,
        "dspark_block_size": 5,
        "dspark_noise_token_id": 128799,
        "dspark_target_layer_ids": [5, 6, 7],
        "dspark_markov_rank": 16,
        "dspark_n_routed_experts": 4,
        "dspark_num_experts_per_tok": 1,
        "tie_word_embeddings": False,
    },
    # A two-block tower (V4.1-Flash's: 32 blocks, 16 heads, SwiGLU 2816; model.v41.vision).
    "vision_config": {
        "hidden_size": 64,
        "patch_size": 14,
        "downsample_ratio": 3,
        "max_image_tokens": 1024,
        "depth": 2,
        "num_heads": 4,
        "intermediate_size": 128,
    },
    "quantization_config": v41_quantization(),
}


def _fingerprint() -> str:
    blob = json.dumps([V41_TINY_CONFIG, TINY_SEED, TINY_FORMAT], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def v41_tiny_model_dir(cache_dir: Path | None = None) -> Path:
    from deepring.model.tiny import cached_checkpoint

    root = cache_dir if cache_dir is not None else env.cache_dir()
    return cached_checkpoint(root, f"v41-tiny-{_fingerprint()}", _write)


def _write(path: Path) -> None:
    import torch

    from deepring.model.config import ModelConfig
    from deepring.model.v41.model import DeepseekV41
    from deepring.model.v41.weights import init_dummy_v41, save_v41_checkpoint

    model = DeepseekV41(ModelConfig.from_hf_dict(V41_TINY_CONFIG))
    init_dummy_v41(model, TINY_SEED)
    save_v41_checkpoint(model, path, V41_TINY_CONFIG, dtype=torch.bfloat16)
    write_v41_tokenizer(path / "tokenizer.json")
