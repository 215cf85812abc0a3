"""Kernels, one module per op: a Triton kernel, its torch reference, and a dispatching entry point.

CPU runs the torch reference; tests also run every Triton kernel under TRITON_INTERPRET=1.
"""
