"""The models that ship with the engine, served by name (`--model tiny`, `--model tiny-trained`).

`tiny` has seeded random weights (its output is gibberish, and the server says so); `tiny-trained`
is the same architecture trained on the Python standard library, with a DSpark drafter
(model.tiny_trained). `v41-tiny` is a DeepSeek V4.1 of tiny's width with random weights
(model.v41.tiny). All are assembled into a checkpoint directory on first use. Torch-free
until a directory is asked for, so the command line can check a --model name cheaply.
"""

from __future__ import annotations

from pathlib import Path

EMBEDDED = ("tiny", "tiny-trained", "v41-tiny")
RANDOM = ("tiny", "v41-tiny")  # embedded models whose weights are random


def is_embedded(model: str | Path) -> bool:
    return isinstance(model, str) and model in EMBEDDED


def embedded_dir(name: str) -> Path:
    """The checkpoint directory of an embedded model, created on first use."""
    if name == "tiny":
        from deepring.model.tiny import tiny_model_dir

        return tiny_model_dir()
    if name == "v41-tiny":
        from deepring.model.v41.tiny import v41_tiny_model_dir

        return v41_tiny_model_dir()
    if name == "tiny-trained":
        from deepring.model.tiny_trained import tiny_trained_model_dir

        return tiny_trained_model_dir()
    raise ValueError(f"no embedded model {name!r}: the embedded models are {', '.join(EMBEDDED)}")
