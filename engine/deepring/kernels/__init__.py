"""Kernels, one module per op: a Triton kernel, its torch reference, and a dispatching entry point;
some ops also have a numba CPU kernel (see dispatch).

CPU runs the numba kernels where an op has one and the torch reference elsewhere; tests hold
each numba kernel to its reference, and run every Triton kernel under TRITON_INTERPRET=1.
"""
