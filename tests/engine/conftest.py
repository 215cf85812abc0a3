"""Engine test settings."""

import pytest
import torch

# One intra-op thread: the test models are tiny (overhead-bound), and a second OpenMP thread
# costs 10x when the cores are shared with another job (a Rust build, another test run).
torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def flush_denormals():
    """Denormals flushed while an engine test module runs, as the engine's CPU path does, and
    restored after: the setting is process-wide, and hypothesis refuses to draw floats under it."""
    torch.set_flush_denormal(True)
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session", autouse=True)
def deepring_cache_dir(tmp_path_factory):
    """Embedded models are created in a per-session directory, never in the user's cache."""
    mp = pytest.MonkeyPatch()
    d = tmp_path_factory.mktemp("deepring-cache")
    mp.setenv("DEEPRING_CACHE_DIR", str(d))
    yield d
    mp.undo()
