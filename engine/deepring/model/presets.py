"""Published model configurations (config.json contents), for sizing and benchmarks.

V41_FLASH follows DeepSeek-V4.1-Flash as public sources describe it (its nested config,
the sharing layout, Engram and DSpark settings; ../shared/reference, deepseek-v4-architecture.md
§1.3): for sizing, e.g. its 890 bytes per token of FP4 global KV.

V4_FLASH follows DeepSeek-V4-Flash's config.json in the original checkpoint's spelling
(compress_ratios, num_hash_layers, qk_rope_head_dim, rope_scaling): 43 layers, two sliding-only,
then CSA (ratio 4) and HCA (ratio 128) alternating; the trailing 0 is the MTP layer.
"""

from __future__ import annotations

V4_FLASH: dict = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "vocab_size": 129280,
    "hidden_size": 4096,
    "num_hidden_layers": 43,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1024,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "sliding_window": 128,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 16,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 2048,
    "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "num_hash_layers": 3,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}


def v41_positions() -> dict:
    """The text config's window, activation and position settings every V4.1 config here shares
    with V4.1-Flash (a fresh dict: configs are edited by their users)."""
    return {
        "sliding_window": 128,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 16,
            "original_max_position_embeddings": 65536,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        "max_position_embeddings": 1048576,
    }


def v41_quantization() -> dict:
    """V4.1-Flash's quantization_config (FP8 weights, FP4 experts)."""
    return {
        "quant_method": "fp8",
        "expert_dtype": "fp4",
        "activation_scheme": "dynamic",
        "weight_block_size": [32, 32],
        "scale_fmt": "ue8m0",
    }


V41_FLASH: dict = {
    "architectures": ["DeepseekV41ForCausalLM"],
    "model_type": "deepseek_v41",
    "dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "image_token_id": 129264,
    "text_config": {
        "vocab_size": 129280,
        "hidden_size": 5120,
        "num_hidden_layers": 40,
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 1280,
        "o_lora_rank": 1024,
        "o_groups": 8,
        **v41_positions(),
        "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
        "kv_source_layer_ids": [2, 8, 14, 20],
        "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
        "candidate_source_layer_id": 20,
        "candidate_topk_blocks": 2048,
        "candidate_block_size": 8,
        "index_topk": 512,
        "index_n_heads": 32,
        "index_head_dim": 128,
        "n_routed_experts": 384,
        "n_shared_experts": 1,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 2304,
        "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": True,
        "topk_method": "noaux_tc",
        "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0,
        "hc_mult": 4,
        "hc_eps": 1e-6,
        "hc_sinkhorn_iters": 20,
        "rms_norm_eps": 1e-6,
        "engram_layer_ids": [1, 14],
        "engram_max_ngram_size": 4,
        "engram_vocab_size": 16000000,
        "engram_n_heads": 8,
        "engram_head_dim": 256,
        "engram_compressed_vocab_size": 99092,
        "engram_pad_token_id": 2,
        "num_nextn_predict_layers": 3,
        "dspark_block_size": 5,
        "dspark_noise_token_id": 128799,
        "dspark_target_layer_ids": [37, 38, 39],
        "dspark_markov_rank": 256,
        "dspark_n_routed_experts": 128,
        "dspark_num_experts_per_tok": 3,
        "tie_word_embeddings": False,
        "use_fp4_sparse_kv": True,
    },
    "vision_config": {"hidden_size": 1024, "patch_size": 14, "downsample_ratio": 3},
    "quantization_config": v41_quantization(),
}
