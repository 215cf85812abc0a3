"""DeepSeek V4.1 (`model_type: deepseek_v41`): config, modules and the serving forward.

What differs from V4 (model/): a causal encoder-decoder (the decoder's global KV comes from the
last encoder layer's output), CSA2 (ratios 1 and 2 without overlap, main KV and indexer keys
owned by a few KV-source layers and shared by the others in Full / Reindex / Reuse modes, a
hierarchical candidate indexer), shifted single-pass hyper-connections, Engram n-gram memory,
no hash routing, and tensor names taken from the official checkpoint as they are.
"""
