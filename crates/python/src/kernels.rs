//! The engine's CPU kernels (deepring-kernels), bound as private names: the engine already loads
//! this module, and these are no part of the recipe API. Arrays cross as little-endian `bytes`
//! (the abi3 build has no buffer protocol before Python 3.11; a step's rows and tile maxima are
//! a few KiB), and the work runs with the GIL released.

use deepring_kernels::int8_head::{self, Int8Head};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

fn value_error(e: int8_head::KernelError) -> PyErr {
    PyValueError::new_err(e.0)
}

fn words<'a, const N: usize>(
    bytes: &'a [u8],
    what: &str,
) -> PyResult<impl Iterator<Item = [u8; N]> + 'a> {
    if bytes.len() % N != 0 {
        return Err(PyValueError::new_err(format!(
            "{what}: {} bytes is not a whole number of {N}-byte values",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(N)
        .map(|c| c.try_into().unwrap_or([0; N])))
}

fn rows_i16(yq: &[u8]) -> PyResult<Vec<i16>> {
    Ok(words::<2>(yq, "rows")?.map(i16::from_le_bytes).collect())
}

fn f32_bytes<'py>(py: Python<'py>, values: &[f32]) -> Bound<'py, PyBytes> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    PyBytes::new(py, &bytes)
}

/// An int8 LM head weight packed for the int8 greedy head's kernel (engine:
/// kernels/greedy_head.py, kind `int8-avx2`).
#[pyclass(module = "deepring_recipe._native", name = "_Int8Head", frozen)]
pub struct PyInt8Head(Int8Head);

#[pymethods]
impl PyInt8Head {
    /// q: the weight's int8 values (vocab x k, each in -127..=127); scales: vocab fp32 scales.
    #[new]
    fn new(py: Python<'_>, q: &[u8], scales: &[u8], vocab: usize, k: usize) -> PyResult<Self> {
        let scales: Vec<f32> = words::<4>(scales, "scales")?
            .map(f32::from_le_bytes)
            .collect();
        py.detach(|| {
            let q: Vec<i8> = q.iter().map(|&b| b as i8).collect();
            Int8Head::new(&q, &scales, vocab, k)
        })
        .map(Self)
        .map_err(value_error)
    }

    /// Tiles of `TILE` tokens (the last one partial).
    #[getter]
    fn tiles(&self) -> usize {
        self.0.tiles()
    }

    /// The packed weight's address, for `deepring_int8_head_tile_max_part` (valid while this
    /// object lives: a frozen class's value never moves).
    #[getter]
    fn address(&self) -> usize {
        &self.0 as *const Int8Head as usize
    }

    /// Tokens per tile.
    #[classattr]
    const TILE: usize = int8_head::TILE;

    /// Whether this CPU runs the AVX2 kernel.
    #[staticmethod]
    fn has_avx2() -> bool {
        int8_head::has_avx2()
    }

    /// Each tile's largest approximate logit of each row: tiles x rows fp32; yq: rows x k int16
    /// values in -127..=127, x: their scale.
    fn tile_max<'py>(
        &self,
        py: Python<'py>,
        yq: &[u8],
        rows: usize,
        x: f32,
        threads: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let yq = rows_i16(yq)?;
        let mut maxima = vec![0f32; self.0.tiles() * rows];
        py.detach(|| self.0.tile_max(&yq, rows, x, &mut maxima, threads))
            .map_err(value_error)?;
        Ok(f32_bytes(py, &maxima))
    }

    /// The approximate logits of the tiles `tiles_of` (uint32 values) of rows `rows_of`:
    /// len x TILE fp32, -inf past the vocabulary.
    fn tile_values<'py>(
        &self,
        py: Python<'py>,
        yq: &[u8],
        rows: usize,
        x: f32,
        rows_of: &[u8],
        tiles_of: &[u8],
    ) -> PyResult<Bound<'py, PyBytes>> {
        let yq = rows_i16(yq)?;
        let rows_of: Vec<u32> = words::<4>(rows_of, "rows_of")?
            .map(u32::from_le_bytes)
            .collect();
        let tiles_of: Vec<u32> = words::<4>(tiles_of, "tiles_of")?
            .map(u32::from_le_bytes)
            .collect();
        let mut values = vec![0f32; rows_of.len() * int8_head::TILE];
        self.0
            .tile_values(&yq, rows, x, &rows_of, &tiles_of, &mut values)
            .map_err(value_error)?;
        Ok(f32_bytes(py, &values))
    }

    /// Every approximate logit of each row: rows x vocab fp32.
    fn logits<'py>(
        &self,
        py: Python<'py>,
        yq: &[u8],
        rows: usize,
        x: f32,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let yq = rows_i16(yq)?;
        let mut logits = vec![0f32; rows * self.0.vocab()];
        py.detach(|| self.0.logits(&yq, rows, x, &mut logits))
            .map_err(value_error)?;
        Ok(f32_bytes(py, &logits))
    }
}

/// `Int8Head::tile_max_range` for part `part` of `parts` (contiguous runs of tiles) through the
/// C ABI, for the engine's numba kernel
/// (kernels/greedy_tiles.py), which runs the parts on the OpenMP threads numba shares with torch:
/// threads of our own would share the cores with torch's, which spin-wait after each of its ops
/// (a 2-core AVX2 EPYC: 11.6 ms for 32 rows after a torch op against 4.7 ms alone). Returns 0,
/// or -1 where the arguments are inconsistent.
///
/// # Safety
/// `head` is a live `_Int8Head`'s `address`; `pairs` points to rows x `pairs()` int32 words and
/// `out` to tiles x rows fp32 values that no one else reads or writes during the call, except
/// other parts of the same call (each writes its own tiles).
#[no_mangle]
pub unsafe extern "C" fn deepring_int8_head_tile_max_part(
    head: usize,
    pairs: usize,
    rows: usize,
    x: f32,
    out: usize,
    part: usize,
    parts: usize,
) -> i32 {
    if head == 0 || pairs == 0 || out == 0 || part >= parts {
        return -1;
    }
    let head = &*(head as *const Int8Head);
    let pairs = std::slice::from_raw_parts(pairs as *const i32, rows * head.pairs());
    // Parts write disjoint tiles; each takes a slice of its own tiles only.
    let per = head.tiles().div_ceil(parts.max(1));
    let t0 = (part * per).min(head.tiles());
    let t1 = (t0 + per).min(head.tiles());
    let mine = std::slice::from_raw_parts_mut((out as *mut f32).add(t0 * rows), (t1 - t0) * rows);
    let run = std::panic::AssertUnwindSafe(|| head.tile_max_range(pairs, rows, x, mine, t0));
    match std::panic::catch_unwind(run) {
        Ok(Ok(())) => 0,
        _ => -1,
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyInt8Head>()
}
