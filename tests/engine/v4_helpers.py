"""Shared helpers for the engine tests: tiny V4 configs, our model and transformers' on the same
weights, and small drivers for prefill / decode / generation over our serving caches."""

from __future__ import annotations

import itertools

import torch
from deepring.cache.pool import CacheConfig, KVCachePool
from deepring.model.batch import ForwardBatch, SeqChunk
from deepring.model.config import CSA, HASH_MOE, HCA, MOE, SLIDING, ModelConfig
from deepring.model.loader import load_model

BASE = {
    "model_type": "deepseek_v4",
    "vocab_size": 512,
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "head_dim": 32,
    "q_lora_rank": 32,
    "partial_rotary_factor": 0.25,
    "o_groups": 2,
    "o_lora_rank": 16,
    "index_n_heads": 8,
    "index_head_dim": 16,
    "hc_mult": 4,
    "max_position_embeddings": 1024,
    "num_nextn_predict_layers": 0,
}

# Three layer-type mixes; every one has sliding-window branches, and between them CSA (with the
# indexer's top-k actually selecting), HCA, hash-routed and learned-routed MoE, YaRN and plain
# compressed RoPE, different windows, expert counts, head groupings and stream counts.
CONFIGS = {
    "swa-csa-hca": {
        **BASE,
        "num_hidden_layers": 4,
        "layer_types": [SLIDING, CSA, HCA, CSA],
        "compress_rates": {CSA: 4, HCA: 8},
        "mlp_layer_types": [HASH_MOE, MOE, MOE, MOE],
        "sliding_window": 8,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "index_topk": 3,
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 256,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    },
    "csa-first": {
        **BASE,
        "num_hidden_layers": 5,
        "num_attention_heads": 8,
        "o_groups": 4,
        "layer_types": [CSA, HCA, SLIDING, HCA, CSA],
        "compress_rates": {CSA: 4, HCA: 16},
        "mlp_layer_types": [HASH_MOE, HASH_MOE, MOE, MOE, MOE],
        "sliding_window": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 1,
        "index_topk": 5,
        "hc_mult": 2,
    },
    "hca-bootstrap": {
        **BASE,
        "num_hidden_layers": 3,
        "layer_types": [HCA, HCA, CSA],
        "compress_rates": {CSA: 2, HCA: 8},
        "mlp_layer_types": [MOE, HASH_MOE, MOE],
        "sliding_window": 4,
        "n_routed_experts": 16,
        "num_experts_per_tok": 4,
        "index_topk": 4,
        "hc_mult": 3,
        "hc_sinkhorn_iters": 5,
        "routed_scaling_factor": 2.5,
    },
}


def model_config(name: str, **overrides) -> ModelConfig:
    return ModelConfig.from_hf_dict({**CONFIGS[name], **overrides})


def ours(config: ModelConfig, seed: int = 1):
    return load_model(config, load_format="dummy", seed=seed, dtype="float32").model


def hf_config(config: ModelConfig):
    from transformers import DeepseekV4Config

    d = config.to_hf_dict()
    for k in ("architectures", "model_type", "mtp_compress_ratios"):
        d.pop(k, None)
    return DeepseekV4Config(**d)


def hf_twin(model):
    """transformers' DeepseekV4ForCausalLM holding exactly our model's (non-MTP) weights."""
    from transformers import DeepseekV4ForCausalLM

    hf = DeepseekV4ForCausalLM(hf_config(model.config)).eval()
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("mtp.")}
    hf.load_state_dict(state, strict=True)
    return hf


def pool_for(model, num_blocks: int = 64, num_slots: int = 8, block_size: int = 16, **kw):
    return KVCachePool(
        model.config.cache_layout(model.dtype),
        CacheConfig(num_blocks=num_blocks, num_slots=num_slots, block_size=block_size, **kw),
        model.device,
    )


def step(model, pool, chunks: list[SeqChunk]) -> torch.Tensor:
    batch = ForwardBatch.build(chunks, model.rope_tables(), pool.cache.block_size, model.device)
    return model(batch, pool).logits


def blocks_for(n_tokens: int, block_size: int, first: int = 1) -> list[int]:
    return list(range(first, first + -(-n_tokens // block_size)))


def prefill_logits(model, ids: list[int], pool=None, splits=(), slot=0, blocks=None):
    """Logits of every position, feeding `ids` in chunks cut at `splits`."""
    pool = pool or pool_for(model)
    blocks = blocks or blocks_for(len(ids), pool.cache.block_size)
    cuts = [0, *sorted(set(splits)), len(ids)]
    outs = [
        step(model, pool, [SeqChunk(ids[a:b], a, slot, blocks, logits="all")])
        for a, b in itertools.pairwise(cuts)
        if b > a
    ]
    return torch.cat(outs)


def greedy_generate(model, prompt: list[int], n: int, pool=None) -> tuple[list[int], torch.Tensor]:
    """Prefill then decode token by token; returns the tokens and each decode step's logits."""
    pool = pool or pool_for(model)
    total = len(prompt) + n
    blocks = blocks_for(total, pool.cache.block_size)
    logits = step(model, pool, [SeqChunk(prompt, 0, 0, blocks)])
    out, all_logits = [], [logits[0]]
    for i in range(n):
        tok = int(logits[0].argmax())
        out.append(tok)
        if i == n - 1:
            break
        logits = step(model, pool, [SeqChunk([tok], len(prompt) + i, 0, blocks)])
        all_logits.append(logits[0])
    return out, torch.stack(all_logits)
