"""Sampling: the per-request parameters (params, torch-free: the frontend and the rings use
them) and the deterministic, batch-invariant sampler (sampler, over kernels.sampling)."""

from deepring.sampling.params import SamplingParams

__all__ = ["SamplingParams"]
