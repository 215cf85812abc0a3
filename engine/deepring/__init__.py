"""DeepRing: a serving engine for DeepSeek V4 / V4.1 models."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("deepring")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+local"


def __getattr__(name: str):
    # The offline API pulls in torch; import it lazily so `deepring --version` stays fast.
    if name in ("LLM", "RequestOutput"):
        from deepring import llm

        return getattr(llm, name)
    if name == "SamplingParams":
        from deepring.sampling.params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'deepring' has no attribute {name!r}")


__all__ = ["LLM", "RequestOutput", "SamplingParams", "__version__"]
