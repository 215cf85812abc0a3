"""Kernels, one module per op: a Triton kernel, its torch reference, and a dispatching entry point;
some ops also have a numba CPU kernel (see dispatch), in the op's module or, for decode
attention, in attention_decode_numba. greedy (the greedy head's settling) and cpu_warmup are
CPU-only.

CPU runs the numba kernels where an op has one and the torch reference elsewhere (prefill
attention's reference runs its blocks through ATen's fused CPU attention); tests hold each
numba kernel to its reference, and run every Triton kernel under TRITON_INTERPRET=1.
"""
