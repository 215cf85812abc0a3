"""Kernels, one module per op: a Triton kernel, its torch reference, numba CPU kernels where they
pay, and the op's entry point, which picks the backend for the tensors it gets (dispatch). The
model calls only the entry points: attention.window_attention, moe.moe_layer,
greedy_head.GreedyArgmax, indexer.indexer_topk, hyper.hc_pre / hc_merge, rmsnorm.rms_norm,
rope.norm_rope / apply_rope, sampling.sample.

Where the kernels live: decode attention's numba kernel in attention_decode_numba, the MoE's in
moe_numba; greedy (the greedy head's settling) and cpu_warmup are CPU-only. CPU runs the numba
kernels where an op has one and the torch reference elsewhere (prefill attention's reference
runs its blocks through ATen's fused CPU attention); tests hold each numba kernel to its
reference, and run every Triton kernel under TRITON_INTERPRET=1.
"""
