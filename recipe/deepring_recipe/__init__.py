"""DeepSeek V4 / V4.1 protocol layer: requests to prompts and token ids, model output to events."""

from ._native import Tokenizer as Tokenizer
from ._native import __version__ as __version__

__all__ = ["Tokenizer", "__version__"]
