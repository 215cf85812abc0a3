//! RenderedPrompt and the two prompt encodings.

use std::sync::OnceLock;

use deepring_recipe::{Encoding, ModelVersion};
use deepring_tokenizer::Tokenizer;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::conversation::PyConversation;
use crate::detach::maybe_detached;
use crate::image::image_to_py;
use crate::json::byte_ranges_to_chars;
use crate::special_tokens::PySpecialTokens;
use crate::tokenizer::PyTokenizer;

#[pyclass(
    module = "deepring_recipe._native",
    name = "RenderedPrompt",
    frozen,
    freelist = 16
)]
pub(crate) struct PyRenderedPrompt {
    prompt: String,
    /// Byte offsets from the renderer; Python sees character offsets, counted on first access
    /// (most callers only want the prompt, or tokenize it from Rust).
    byte_ranges: Vec<(usize, usize)>,
    special_ranges: OnceLock<Vec<(usize, usize)>>,
    image_sources: Vec<Py<PyAny>>,
}

#[pymethods]
impl PyRenderedPrompt {
    #[getter]
    fn prompt(&self) -> &str {
        &self.prompt
    }
    #[getter]
    fn special_ranges(&self) -> Vec<(usize, usize)> {
        self.special_ranges
            .get_or_init(|| byte_ranges_to_chars(&self.prompt, &self.byte_ranges))
            .clone()
    }
    #[getter]
    fn image_sources(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        self.image_sources.iter().map(|s| s.clone_ref(py)).collect()
    }
    fn __repr__(&self) -> String {
        format!(
            "RenderedPrompt(prompt=<{} characters>, image_sources={})",
            self.prompt.chars().count(),
            self.image_sources.len()
        )
    }
}

/// Shared implementation of the two encoding classes.
#[derive(Clone)]
pub(crate) struct EncodingState {
    pub(crate) encoding: Encoding,
    pub(crate) tokenizer: Option<Tokenizer>,
}

impl EncodingState {
    fn new(version: ModelVersion) -> Self {
        EncodingState {
            encoding: Encoding::new(version),
            tokenizer: None,
        }
    }

    fn render(&self, py: Python<'_>, conv: &PyConversation) -> PyResult<PyRenderedPrompt> {
        let size: usize = conv
            .inner
            .messages
            .iter()
            .map(|m| m.content.len() + m.reasoning_content.as_ref().map_or(0, String::len))
            .sum();
        let rendered = maybe_detached(py, size, || self.encoding.render(&conv.inner));
        let image_sources = rendered
            .image_sources
            .iter()
            .map(|s| image_to_py(py, s))
            .collect::<PyResult<_>>()?;
        Ok(PyRenderedPrompt {
            prompt: rendered.prompt,
            byte_ranges: rendered.special_ranges,
            special_ranges: OnceLock::new(),
            image_sources,
        })
    }

    pub(crate) fn encode_ids(&self, conv: &deepring_recipe::Conversation) -> PyResult<Vec<u32>> {
        let tokenizer = self
            .tokenizer
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("no tokenizer is attached to the encoding"))?;
        let rendered = self.encoding.render(conv);
        tokenizer
            .encode_prompt(&rendered.prompt, &rendered.special_ranges)
            .map_err(|e| PyRuntimeError::new_err(format!("failed to encode conversation: {e}")))
    }
}

macro_rules! encoding_class {
    ($rust:ident, $py:literal, $version:expr) => {
        #[pyclass(module = "deepring_recipe._native", name = $py, frozen)]
        #[derive(Clone)]
        pub(crate) struct $rust {
            pub(crate) state: EncodingState,
        }

        #[pymethods]
        impl $rust {
            #[new]
            fn new() -> Self {
                $rust {
                    state: EncodingState::new($version),
                }
            }

            fn with_tokenizer(&self, tokenizer: PyRef<'_, PyTokenizer>) -> Self {
                let mut state = self.state.clone();
                state.tokenizer = Some(tokenizer.inner.clone());
                $rust { state }
            }

            fn with_special_tokens(&self, special_tokens: PyRef<'_, PySpecialTokens>) -> Self {
                let mut state = self.state.clone();
                state.encoding.special_tokens = special_tokens.inner.clone();
                $rust { state }
            }

            fn render_conversation(
                &self,
                py: Python<'_>,
                conversation: PyRef<'_, PyConversation>,
            ) -> PyResult<PyRenderedPrompt> {
                self.state.render(py, &conversation)
            }

            fn encode(
                &self,
                py: Python<'_>,
                conversation: PyRef<'_, PyConversation>,
            ) -> PyResult<Vec<u32>> {
                let conv = &conversation.inner;
                py.detach(|| self.state.encode_ids(conv))
            }

            /// `encode`'s ids as little-endian int32 bytes (`numpy.frombuffer(b, "<i4")`): a
            /// long prompt's ids without one Python int per token, which a caller would hold
            /// the GIL to build (~80 ms for an 8 MB prompt, stalling every other thread).
            fn encode_bytes<'py>(
                &self,
                py: Python<'py>,
                conversation: PyRef<'_, PyConversation>,
            ) -> PyResult<Bound<'py, PyBytes>> {
                let conv = &conversation.inner;
                let bytes = py.detach(|| -> PyResult<Vec<u8>> {
                    let ids = self.state.encode_ids(conv)?;
                    // Token ids are below 2^31 (vocabularies of ~130k entries).
                    Ok(ids
                        .iter()
                        .flat_map(|&id| (id as i32).to_le_bytes())
                        .collect())
                })?;
                Ok(PyBytes::new(py, &bytes))
            }
        }
    };
}

encoding_class!(
    PyDeepseekV4Encoding,
    "DeepseekV4Encoding",
    ModelVersion::DeepseekV4Pro
);
encoding_class!(
    PyDeepseekV41Encoding,
    "DeepseekV41Encoding",
    ModelVersion::DeepseekV41Flash
);

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRenderedPrompt>()?;
    m.add_class::<PyDeepseekV4Encoding>()?;
    m.add_class::<PyDeepseekV41Encoding>()?;
    Ok(())
}
