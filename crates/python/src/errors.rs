//! The single mapping from core errors to Python exceptions.

use deepring_recipe::stream::StreamError;
use deepring_recipe::{ConversionError as CoreConversionError, RecipeError};
use deepring_tokenizer::TokenizerError;
use pyo3::exceptions::{PyException, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::PyErr;

pyo3::create_exception!(
    deepring_recipe._native,
    ConversionError,
    PyException,
    "Raised when a protocol request is invalid or cannot be converted."
);

pub(crate) fn tokenizer_load(e: TokenizerError) -> PyErr {
    match e {
        TokenizerError::Io { .. } => PyOSError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

pub(crate) fn tokenizer_use(e: TokenizerError) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

pub(crate) fn conversion(e: &CoreConversionError) -> PyErr {
    Python::attach(|py| {
        let err = ConversionError::new_err(e.message.clone());
        let value = err.value(py);
        let set = value
            .setattr("status_code", e.status_code)
            .and_then(|_| value.setattr("body", e.body()));
        match set {
            Ok(()) => err,
            Err(set_err) => set_err,
        }
    })
}

pub(crate) fn recipe(e: RecipeError) -> PyErr {
    match e {
        RecipeError::Conversion(c) => conversion(&c),
        RecipeError::InvalidBody(m) | RecipeError::InvalidArgument(m) => PyValueError::new_err(m),
        RecipeError::Misuse(m) => PyRuntimeError::new_err(m),
    }
}

/// Stream misuse and malformed chunks: `RuntimeError` with the official messages.
pub(crate) fn stream(e: StreamError) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

pub(crate) fn generator_consumed() -> PyErr {
    PyRuntimeError::new_err("chunk generator has been consumed")
}

pub(crate) fn chunk_consumed() -> PyErr {
    PyRuntimeError::new_err("protocol chunk has been consumed")
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let class = py.get_type::<ConversionError>();
    // Class-level defaults so the attributes exist on the type as the stub declares them.
    class.setattr("status_code", 400)?;
    class.setattr("body", "")?;
    m.add("ConversionError", class)?;
    Ok(())
}
