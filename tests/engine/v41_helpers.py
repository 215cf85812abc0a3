"""Shared helpers for the V4.1 tests: the tiny structurally complete config and drivers for
prefill / decode / generation over the engine's paged caches."""

from __future__ import annotations

import copy
import functools

import torch
from deepring.cache.pool import CacheConfig, KVCachePool
from deepring.model.batch import ForwardBatch, SeqChunk
from deepring.model.config import ModelConfig
from deepring.model.loader import load_model
from deepring.model.presets import v41_quantization

# Nine layers exercise every path: 0-1 sliding only (Engram at 1), 2-4 the encoder's ratio-2
# CSA2 (2 Full, 3 Reindex, 4 Reuse; Engram at 3 too), 5-8 the decoder's ratio-1 CSA2 (5 Full,
# the CED boundary and the candidate source; 6 Reuse; 7 Reindex inside the candidate pool;
# 8 Reuse). A window of 4 and top-4 from up to 20-odd entries make every selection bite; the
# candidate pool (2 blocks of 3) is smaller than the visible entries, so it restricts layer 7.
TINY_V41: dict = {
    "model_type": "deepseek_v41",
    "architectures": ["DeepseekV41ForCausalLM"],
    "dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "image_token_id": 500,
    "text_config": {
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": 9,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "qk_rope_head_dim": 8,
        "q_lora_rank": 32,
        "o_lora_rank": 16,
        "o_groups": 2,
        "sliding_window": 4,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 4,
            "original_max_position_embeddings": 64,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        "max_position_embeddings": 1024,
        "compress_ratios": [0, 0, 2, 2, 2, 1, 1, 1, 1, 0],
        "kv_source_layer_ids": [2, 5],
        "index_source_layer_ids": [2, 3, 5, 7],
        "candidate_source_layer_id": 5,
        "candidate_topk_blocks": 2,
        "candidate_block_size": 3,
        "index_topk": 4,
        "index_n_heads": 2,
        "index_head_dim": 32,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": True,
        "topk_method": "noaux_tc",
        "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0,
        "hc_mult": 2,
        "hc_eps": 1e-6,
        "hc_sinkhorn_iters": 5,
        "hc_shifted": True,
        "rms_norm_eps": 1e-6,
        "engram_layer_ids": [1, 3],
        "engram_max_ngram_size": 3,
        "engram_vocab_size": 61,
        "engram_n_heads": 2,
        "engram_head_dim": 8,
        "engram_compressed_vocab_size": None,
        "engram_pad_token_id": 2,
        "num_nextn_predict_layers": 1,
        "dspark_block_size": 3,
        "dspark_noise_token_id": 5,
        "dspark_target_layer_ids": [6, 7, 8],
        "dspark_markov_rank": 8,
        "dspark_n_routed_experts": 2,
        "dspark_num_experts_per_tok": 1,
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "hidden_size": 16,
        "patch_size": 14,
        "downsample_ratio": 3,
        "max_image_tokens": 16,
        "depth": 1,
        "num_heads": 2,
        "intermediate_size": 16,
    },
    "quantization_config": v41_quantization(),
}


def tiny_dict() -> dict:
    return copy.deepcopy(TINY_V41)


@functools.lru_cache(maxsize=4)
def tiny_model(seed: int = 0):
    config = ModelConfig.from_hf_dict(tiny_dict())
    model = load_model(config, load_format="dummy", seed=seed, dtype="float32").model
    model.decoder_keep = 0  # the drivers here set SeqChunk.decoder_from themselves
    return model


def make_pool(model, num_blocks: int = 64, num_slots: int = 8, block_size: int = 6):
    layout = model.config.cache_layout(model.dtype)
    return KVCachePool(layout, CacheConfig(num_blocks, num_slots, block_size))


class Seq:
    """One request's cache bookkeeping (slot, blocks, tokens so far)."""

    def __init__(self, slot: int, blocks: list[int]) -> None:
        self.slot, self.blocks, self.tokens = slot, blocks, []

    def chunk(self, new: list[int], logits: str = "last", decoder_from: int = 0) -> SeqChunk:
        start = len(self.tokens)
        c = SeqChunk(
            new, start, self.slot, self.blocks, logits, context=self.tokens[-8:],
            decoder_from=decoder_from,
        )  # fmt: skip
        self.tokens = self.tokens + list(new)
        return c


def new_seqs(n: int, blocks_each: int = 8) -> list[Seq]:
    return [Seq(i, list(range(1 + i * blocks_each, 1 + (i + 1) * blocks_each))) for i in range(n)]


def step(model, pool, chunks: list[SeqChunk]) -> torch.Tensor:
    batch = ForwardBatch.build(chunks, model.rope_tables(), pool.cache.block_size, model.device)
    return model(batch, pool).logits


def greedy_generate(model, pool, seq: Seq, prompt: list[int], n: int) -> list[int]:
    logits = step(model, pool, [seq.chunk(prompt)])
    out = [int(logits[-1].argmax())]
    for _ in range(n - 1):
        logits = step(model, pool, [seq.chunk([out[-1]])])
        out.append(int(logits[-1].argmax()))
    return out
