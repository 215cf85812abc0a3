"""The engine-independent pieces of speculative decoding (DSpark): lossless verification of
drafts and its deterministic randomness (accept). Torch and numpy only; no engine state."""

from deepring.spec.accept import accept_greedy, accept_sampled, step_uniforms, uniforms

__all__ = ["accept_greedy", "accept_sampled", "step_uniforms", "uniforms"]
