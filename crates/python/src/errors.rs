//! The single mapping from core errors to Python exceptions.

use deepring_tokenizer::TokenizerError;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

pub(crate) fn tokenizer_load(e: TokenizerError) -> PyErr {
    match e {
        TokenizerError::Io { .. } => PyOSError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

pub(crate) fn tokenizer_use(e: TokenizerError) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}
