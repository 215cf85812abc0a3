//! `ResponsesEcho`: the request settings a Responses response object reports.

use deepring_recipe::response::{ResponsesEcho, ServedSettings};
use pyo3::prelude::*;
use pyo3::types::PyDict;

#[pyclass(module = "deepring_recipe._native", name = "ResponsesEcho", frozen)]
#[derive(Clone)]
pub(crate) struct PyResponsesEcho {
    pub(crate) inner: ResponsesEcho,
}

/// Wrap the settings `ResponsesRequest.echo()` read from a request (`ResponsesEcho::new`).
pub(crate) fn responses_echo(inner: ResponsesEcho) -> PyResponsesEcho {
    PyResponsesEcho { inner }
}

#[pymethods]
impl PyResponsesEcho {
    #[new]
    fn new() -> Self {
        PyResponsesEcho {
            inner: ResponsesEcho::default(),
        }
    }
    #[getter]
    fn instructions(&self) -> Option<&str> {
        self.inner.instructions.as_deref()
    }
    #[getter]
    fn max_output_tokens(&self) -> Option<u64> {
        self.inner.max_output_tokens
    }
    #[getter]
    fn temperature(&self) -> f64 {
        f64::from(self.inner.temperature)
    }
    #[getter]
    fn top_p(&self) -> f64 {
        f64::from(self.inner.top_p)
    }
    #[getter]
    fn top_logprobs(&self) -> u64 {
        self.inner.top_logprobs
    }
    #[getter]
    fn user(&self) -> Option<&str> {
        self.inner.user.as_deref()
    }
    /// A copy whose response objects report these settings, which the request type does not
    /// read and the official always reports with these defaults: what a server that honours
    /// them sets (an addition, recipe/DEVIATIONS.md A2). `metadata`: a dict (None: `{}`).
    #[pyo3(signature = (
        *,
        parallel_tool_calls = true,
        max_tool_calls = None,
        metadata = None,
        prompt_cache_key = None,
        safety_identifier = None,
        presence_penalty = 0.0,
        frequency_penalty = 0.0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn with_served(
        &self,
        parallel_tool_calls: bool,
        max_tool_calls: Option<u64>,
        metadata: Option<&Bound<'_, PyDict>>,
        prompt_cache_key: Option<String>,
        safety_identifier: Option<String>,
        presence_penalty: f64,
        frequency_penalty: f64,
    ) -> PyResult<Self> {
        let metadata = match metadata {
            Some(d) => crate::json::to_json(d.as_any())?,
            None => serde_json::Value::Object(serde_json::Map::new()),
        };
        let mut inner = self.inner.clone();
        inner.served = ServedSettings {
            parallel_tool_calls,
            max_tool_calls,
            metadata,
            prompt_cache_key,
            safety_identifier,
            presence_penalty,
            frequency_penalty,
        };
        Ok(PyResponsesEcho { inner })
    }
}
