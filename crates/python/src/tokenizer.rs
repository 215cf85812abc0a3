//! `Tokenizer`: loading, full-vocabulary `encode`, and the thread policy of prompt encoding.

use deepring_tokenizer::{Parallelism, Tokenizer};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::errors;

#[pyclass(name = "Tokenizer", module = "deepring_recipe._native", frozen)]
#[derive(Clone)]
pub(crate) struct PyTokenizer {
    pub(crate) inner: Tokenizer,
}

fn parallelism(threads: Option<usize>) -> PyResult<Parallelism> {
    match threads {
        None => Ok(Parallelism::Auto),
        Some(0) => Err(PyValueError::new_err("threads must be at least 1")),
        Some(n) => Ok(Parallelism::Threads(n)),
    }
}

#[pymethods]
impl PyTokenizer {
    #[staticmethod]
    #[pyo3(signature = (path, *, threads = None))]
    fn from_file(py: Python<'_>, path: &str, threads: Option<usize>) -> PyResult<Self> {
        let p = parallelism(threads)?;
        let inner = py
            .detach(|| Tokenizer::from_file(path))
            .map_err(errors::tokenizer_load)?;
        Ok(Self {
            inner: inner.with_parallelism(p),
        })
    }

    #[staticmethod]
    #[pyo3(signature = (text, *, threads = None))]
    fn from_str(py: Python<'_>, text: &str, threads: Option<usize>) -> PyResult<Self> {
        let p = parallelism(threads)?;
        let inner = py
            .detach(|| Tokenizer::from_json(text))
            .map_err(errors::tokenizer_load)?;
        Ok(Self {
            inner: inner.with_parallelism(p),
        })
    }

    /// `tokenizer.json` from a local file or directory, or from the Hugging Face cache for a Hub
    /// id; never downloaded (the official downloads: recipe/DEVIATIONS.md). `token` is accepted
    /// for signature compatibility and unused.
    #[staticmethod]
    #[pyo3(signature = (identifier, revision = None, token = None, *, threads = None))]
    fn from_pretrained(
        py: Python<'_>,
        identifier: &str,
        revision: Option<&str>,
        token: Option<&str>,
        threads: Option<usize>,
    ) -> PyResult<Self> {
        let _ = token;
        let p = parallelism(threads)?;
        let path = deepring_tokenizer::pretrained::locate(identifier, revision)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let path = path.to_string_lossy().into_owned();
        let inner = py
            .detach(|| Tokenizer::from_file(&path))
            .map_err(errors::tokenizer_load)?;
        Ok(Self {
            inner: inner.with_parallelism(p),
        })
    }

    /// A tokenizer sharing this vocabulary whose prompt encoding uses `threads` threads
    /// (`None`: `DEEPRING_TOKENIZER_THREADS`, else every core).
    #[pyo3(signature = (threads))]
    fn with_threads(&self, threads: Option<usize>) -> PyResult<Self> {
        Ok(Self {
            inner: self.inner.with_parallelism(parallelism(threads)?),
        })
    }

    #[getter]
    fn threads(&self) -> usize {
        self.inner.parallelism().threads()
    }

    fn encode(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u32>> {
        py.detach(|| self.inner.encode(text))
            .map_err(errors::tokenizer_use)
    }

    /// Encode plain text with the BPE model only (no added-vocabulary matching, no BOS).
    fn encode_plain(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u32>> {
        py.detach(|| self.inner.encode_plain(text))
            .map_err(errors::tokenizer_use)
    }

    /// Encode `prompt` whose `special_ranges` (code-point offsets) each hold one added token.
    fn encode_prompt(
        &self,
        py: Python<'_>,
        prompt: &str,
        special_ranges: Vec<(usize, usize)>,
    ) -> PyResult<Vec<u32>> {
        let ranges = char_ranges_to_bytes(prompt, &special_ranges)?;
        py.detach(|| self.inner.encode_prompt(prompt, &ranges))
            .map_err(errors::tokenizer_use)
    }

    fn decode(&self, py: Python<'_>, ids: Vec<u32>) -> String {
        py.detach(|| self.inner.decode(&ids))
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    fn __repr__(&self) -> String {
        format!("Tokenizer(vocab_size={})", self.inner.vocab_size())
    }
}

/// Python code-point offsets -> byte offsets (ascending ranges).
pub(crate) fn char_ranges_to_bytes(
    text: &str,
    ranges: &[(usize, usize)],
) -> PyResult<Vec<(usize, usize)>> {
    let mut out = Vec::with_capacity(ranges.len());
    let mut chars = text.char_indices().enumerate().peekable();
    let mut byte_at = |cp: usize| -> PyResult<usize> {
        while let Some(&(i, (b, _))) = chars.peek() {
            if i == cp {
                return Ok(b);
            }
            if i > cp {
                break;
            }
            chars.next();
        }
        if cp == text.chars().count() {
            return Ok(text.len());
        }
        Err(PyValueError::new_err(format!(
            "special range offset {cp} is out of order or outside the prompt"
        )))
    };
    for &(s, e) in ranges {
        let bs = byte_at(s)?;
        let be = byte_at(e)?;
        out.push((bs, be));
    }
    Ok(out)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTokenizer>()?;
    Ok(())
}
