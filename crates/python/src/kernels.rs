//! The engine's CPU kernels (deepring-kernels), bound as private names: the engine already loads
//! this module, and these are no part of the recipe API. Arrays cross as little-endian `bytes`
//! (the abi3 build has no buffer protocol before Python 3.11; a step's rows and candidates are a
//! few KiB), and the work runs with the GIL released.

use deepring_kernels::int8_head::{self, Found, Int8Head};
use deepring_kernels::parts;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

fn value_error(e: int8_head::KernelError) -> PyErr {
    PyValueError::new_err(e.0)
}

fn words<const N: usize>(bytes: &[u8], what: &str) -> PyResult<Vec<[u8; N]>> {
    if bytes.len() % N != 0 {
        return Err(PyValueError::new_err(format!(
            "{what}: {} bytes is not a whole number of {N}-byte values",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(N)
        .map(|c| c.try_into().unwrap_or([0; N]))
        .collect())
}

fn f32s(bytes: &[u8], what: &str) -> PyResult<Vec<f32>> {
    Ok(words::<4>(bytes, what)?
        .into_iter()
        .map(f32::from_le_bytes)
        .collect())
}

fn i8s(bytes: &[u8]) -> Vec<i8> {
    bytes.iter().map(|&b| b as i8).collect()
}

fn le_bytes<'py, T, const N: usize>(
    py: Python<'py>,
    values: &[T],
    f: impl Fn(&T) -> [u8; N],
) -> Bound<'py, PyBytes> {
    let bytes: Vec<u8> = values.iter().flat_map(f).collect();
    PyBytes::new(py, &bytes)
}

/// An int8 LM head weight laid out for the int8-avx2 greedy head's kernel (engine:
/// kernels/greedy_int8.py).
#[pyclass(module = "deepring_recipe._native", name = "_Int8Head", frozen)]
pub struct PyInt8Head(Int8Head);

#[pymethods]
impl PyInt8Head {
    /// q: the weight's int8 values (vocab x k, each in -127..=127); scales: vocab fp32 scales.
    #[new]
    fn new(py: Python<'_>, q: &[u8], scales: &[u8], vocab: usize, k: usize) -> PyResult<Self> {
        let scales = f32s(scales, "scales")?;
        py.detach(|| Int8Head::new(&i8s(q), &scales, vocab, k))
            .map(Self)
            .map_err(value_error)
    }

    /// The largest |row value| the kernel takes.
    #[classattr]
    const ROW_MAX: i8 = int8_head::ROW_MAX;

    /// Whether this CPU runs the AVX2 kernel.
    #[staticmethod]
    fn has_avx2() -> bool {
        int8_head::has_avx2()
    }

    /// Whether parts run on torch's OpenMP (libgomp) team, not on threads of their own.
    #[staticmethod]
    fn on_openmp() -> bool {
        parts::on_openmp()
    }

    /// Each row's candidates: yq rows x k int8 values in -ROW_MAX..=ROW_MAX, x their fp32
    /// scales, a the fp64 bounds. Returns (best fp32 per row, lost uint8 per row, and per
    /// candidate its row and token as uint32 and its approximate logit as fp32).
    #[allow(clippy::type_complexity)]
    fn candidates<'py>(
        &self,
        py: Python<'py>,
        yq: &[u8],
        rows: usize,
        x: &[u8],
        a: &[u8],
        threads: usize,
    ) -> PyResult<(
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
    )> {
        let (yq, x) = (i8s(yq), f32s(x, "x")?);
        let a: Vec<f64> = words::<8>(a, "a")?
            .into_iter()
            .map(f64::from_le_bytes)
            .collect();
        let found: Found = py
            .detach(|| self.0.candidates(&yq, rows, &x, &a, threads))
            .map_err(value_error)?;
        Ok((
            le_bytes(py, &found.best, |v| v.to_le_bytes()),
            le_bytes(py, &found.lost, |&v| [v as u8]),
            le_bytes(py, &found.rows, |v| v.to_le_bytes()),
            le_bytes(py, &found.tokens, |v| v.to_le_bytes()),
            le_bytes(py, &found.values, |v| v.to_le_bytes()),
        ))
    }

    /// Every approximate logit of each row: rows x vocab fp32, the vocabulary in `threads`
    /// parts.
    fn logits<'py>(
        &self,
        py: Python<'py>,
        yq: &[u8],
        rows: usize,
        x: &[u8],
        threads: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let (yq, x) = (i8s(yq), f32s(x, "x")?);
        let logits = py
            .detach(|| self.0.logits(&yq, rows, &x, threads))
            .map_err(value_error)?;
        Ok(le_bytes(py, &logits, |v| v.to_le_bytes()))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyInt8Head>()
}
