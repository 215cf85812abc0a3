"""Step-time models to start from: the prior of a worker's online fit, and the ground truth of
the cluster simulator.

TINY_CPU: the embedded `tiny` model on one CPU thread, fitted by `deepring simulate
--calibrate` (sim/calibrate.py) on the dev machine (AMD EPYC, 2 cores shared with other jobs;
fp32, bf16 greedy head), in a quiet moment: with the other jobs busier the same calibration
gave steps up to twice as long (base 15 ms), which is why every worker fits its own model
online and this is only where the fit starts. Rerun it to refresh the numbers.

H800_GPU: one H800 GPU as a data-parallel rank of a DeepSeek-V3-style expert-parallel
deployment, parameterised from DeepSeek's published production figures ("DeepSeek-V3/R1
Inference System Overview", open-infra-index, Feb 2025), per node of 8 GPUs:
  - decode: 14.8k output tokens/s per node at an average output speed of 20-22 tokens/s per
    user, with an average KV length of 4,989 tokens per output token;
  - prefill: 73.7k input tokens/s per node including cache hits (56.3% hit rate), so about
    32.2k computed tokens/s per node.
Per GPU that is 1,850 decode tokens/s at about 1/21 s per step, i.e. a decode batch of about
88 requests holding 88 x 4,989 = 439k tokens, and about 4.0k computed prefill tokens/s. The
split between the terms is our assumption (the figures only pin the totals): 20 ms per step
(expert weights, the all-to-all; the 5-stage decode pipeline is not modelled), 200 us per token,
50 us per request, and the attention terms set so that the decode step lands on 47.6 ms
(88 x 4,989 context x 12.8 ns = 5.6 ms) and a prefill token at ~4k context costs ~240 us
(10 ns per query-key pair). MTP and speculative decoding are not modelled: every step is one
token per request.
"""

from __future__ import annotations

from deepring.cost.model import StepCost

TINY_CPU = StepCost.of(base=6.76e-3, token=7.22e-5, seq=1.55e-4, pair=2.2e-8, context=8.48e-7)

H800_GPU = StepCost.of(
    base=20e-3, token=200e-6, seq=50e-6, pair=10e-9, context=12.8e-9
)  # fmt: skip

PRESETS = {"tiny-cpu": TINY_CPU, "h800": H800_GPU}


def prior_for(device_type: str) -> StepCost:
    """The prior of a worker's fit on this kind of device: a wrong prior only costs the first
    steps' chunk sizes; the fit takes over within tens of steps."""
    return H800_GPU if device_type == "cuda" else TINY_CPU
