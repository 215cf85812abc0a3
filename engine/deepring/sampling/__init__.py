"""Sampling parameters and the deterministic sampler."""

from deepring.sampling.params import SamplingParams
from deepring.sampling.sampler import Sampler, uniform

__all__ = ["Sampler", "SamplingParams", "uniform"]
