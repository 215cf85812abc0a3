"""DeepRing: a serving engine for DeepSeek V4 / V4.1 models."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("deepring")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+local"

__all__ = ["__version__"]
