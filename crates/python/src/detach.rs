//! Work on large inputs runs with the GIL released.

use pyo3::prelude::*;

/// Bodies from this size on are parsed and converted with the GIL released; below it, releasing
/// and taking the GIL back costs more than the work (a 1-turn request converts in about 1 µs).
const DETACH_BYTES: usize = 16 * 1024;

/// Run `f`, with the GIL released when the input is large (`size` in bytes).
pub(crate) fn maybe_detached<R: Send>(
    py: Python<'_>,
    size: usize,
    f: impl FnOnce() -> R + Send,
) -> R {
    if size >= DETACH_BYTES {
        py.detach(f)
    } else {
        f()
    }
}
