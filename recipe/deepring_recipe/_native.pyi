from collections.abc import Sequence
from typing import final

__all__ = ["Tokenizer", "__version__"]
__version__: str

@final
class Tokenizer:
    """A Hugging Face `tokenizer.json` for prompt encoding and streaming decode.

    `threads` sets how many threads prompt encoding uses; `None` means
    `DEEPRING_TOKENIZER_THREADS`, else every available core.
    """

    @staticmethod
    def from_file(path: str, *, threads: int | None = None) -> Tokenizer: ...
    @staticmethod
    def from_str(text: str, *, threads: int | None = None) -> Tokenizer: ...
    def with_threads(self, threads: int | None) -> Tokenizer:
        """Return a tokenizer sharing this vocabulary with another thread count."""
    @property
    def threads(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    def encode(self, text: str) -> list[int]:
        """Encode with the full vocabulary: special-token spellings become their ids."""
    def encode_plain(self, text: str) -> list[int]:
        """Encode with the BPE model only: no added-vocabulary matching, no BOS."""
    def encode_prompt(self, prompt: str, special_ranges: Sequence[tuple[int, int]]) -> list[int]:
        """Encode a rendered prompt; each range (code-point offsets) is one added token."""
    def decode(self, ids: Sequence[int]) -> str: ...
    def token_to_id(self, token: str) -> int | None: ...
