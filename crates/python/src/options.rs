//! ConversionOptions, InferenceOptions, OutputConstraint, ParsingOptions.

use std::collections::BTreeMap;

use deepring_recipe::request::{
    ConversionOptions, InferenceOptions, OutputConstraint, ParsingOptions,
};
use pyo3::prelude::*;

use crate::enums::{
    PyModelVersion, PyReasoningContentBehavior, PyThinkingInitialStage, PyWebSearchBehavior,
};
use crate::special_tokens::PySpecialTokens;

#[pyclass(module = "deepring_recipe._native", name = "ConversionOptions", frozen)]
#[derive(Clone)]
pub(crate) struct PyConversionOptions {
    pub(crate) inner: ConversionOptions,
}

impl PyConversionOptions {
    fn with(&self, f: impl FnOnce(&mut ConversionOptions)) -> Self {
        let mut inner = self.inner.clone();
        f(&mut inner);
        PyConversionOptions { inner }
    }
}

#[pymethods]
impl PyConversionOptions {
    #[new]
    #[pyo3(signature = (
        *, default_thinking_mode = true,
        reasoning_content_behavior = PyReasoningContentBehavior::FillEmpty,
        responses_web_search = PyWebSearchBehavior::Drop,
        messages_web_search = PyWebSearchBehavior::Reject,
        thinking_max_tokens_upper_bound = 393_216,
        non_thinking_max_tokens_upper_bound = 393_216
    ))]
    fn new(
        default_thinking_mode: bool,
        reasoning_content_behavior: PyReasoningContentBehavior,
        responses_web_search: PyWebSearchBehavior,
        messages_web_search: PyWebSearchBehavior,
        thinking_max_tokens_upper_bound: u32,
        non_thinking_max_tokens_upper_bound: u32,
    ) -> Self {
        PyConversionOptions {
            inner: ConversionOptions {
                default_thinking_mode,
                reasoning_content_behavior: reasoning_content_behavior.into(),
                responses_web_search: responses_web_search.into(),
                messages_web_search: messages_web_search.into(),
                thinking_max_tokens_upper_bound,
                non_thinking_max_tokens_upper_bound,
                ..ConversionOptions::default()
            },
        }
    }
    #[getter]
    fn default_thinking_mode(&self) -> bool {
        self.inner.default_thinking_mode
    }
    #[getter]
    fn model_versions_by_name(&self) -> BTreeMap<String, PyModelVersion> {
        self.inner
            .model_versions_by_name
            .iter()
            .map(|(k, v)| (k.clone(), (*v).into()))
            .collect()
    }
    #[getter]
    fn thinking_max_tokens_upper_bound(&self) -> u32 {
        self.inner.thinking_max_tokens_upper_bound
    }
    #[getter]
    fn non_thinking_max_tokens_upper_bound(&self) -> u32 {
        self.inner.non_thinking_max_tokens_upper_bound
    }
    #[getter]
    fn reasoning_content_behavior(&self) -> PyReasoningContentBehavior {
        self.inner.reasoning_content_behavior.into()
    }
    #[getter]
    fn responses_web_search(&self) -> PyWebSearchBehavior {
        self.inner.responses_web_search.into()
    }
    #[getter]
    fn messages_web_search(&self) -> PyWebSearchBehavior {
        self.inner.messages_web_search.into()
    }
    #[getter]
    fn special_tokens(&self) -> PySpecialTokens {
        PySpecialTokens {
            inner: self.inner.special_tokens.clone(),
        }
    }
    fn with_default_thinking_mode(&self, default_thinking_mode: bool) -> Self {
        self.with(|o| o.default_thinking_mode = default_thinking_mode)
    }
    fn with_reasoning_content_behavior(
        &self,
        reasoning_content_behavior: PyReasoningContentBehavior,
    ) -> Self {
        self.with(|o| o.reasoning_content_behavior = reasoning_content_behavior.into())
    }
    fn with_responses_web_search(&self, responses_web_search: PyWebSearchBehavior) -> Self {
        self.with(|o| o.responses_web_search = responses_web_search.into())
    }
    fn with_messages_web_search(&self, messages_web_search: PyWebSearchBehavior) -> Self {
        self.with(|o| o.messages_web_search = messages_web_search.into())
    }
    fn with_special_tokens(&self, special_tokens: PyRef<'_, PySpecialTokens>) -> Self {
        let tokens = special_tokens.inner.clone();
        self.with(|o| o.special_tokens = tokens)
    }
    fn with_model_alias(&self, model: String, model_version: PyModelVersion) -> Self {
        self.with(|o| {
            o.model_versions_by_name.insert(model, model_version.into());
        })
    }
    fn with_model_versions_by_name(
        &self,
        model_versions_by_name: BTreeMap<String, PyModelVersion>,
    ) -> Self {
        self.with(|o| {
            o.model_versions_by_name = model_versions_by_name
                .into_iter()
                .map(|(k, v)| (k, v.into()))
                .collect();
        })
    }
    fn with_thinking_max_tokens_upper_bound(&self, thinking_max_tokens_upper_bound: u32) -> Self {
        self.with(|o| o.thinking_max_tokens_upper_bound = thinking_max_tokens_upper_bound)
    }
    fn with_non_thinking_max_tokens_upper_bound(
        &self,
        non_thinking_max_tokens_upper_bound: u32,
    ) -> Self {
        self.with(|o| o.non_thinking_max_tokens_upper_bound = non_thinking_max_tokens_upper_bound)
    }
}

#[pyclass(module = "deepring_recipe._native", name = "OutputConstraint", frozen)]
#[derive(Clone)]
pub(crate) struct PyOutputConstraint {
    pub(crate) inner: OutputConstraint,
}

#[pymethods]
impl PyOutputConstraint {
    #[getter]
    fn kind(&self) -> &str {
        &self.inner.kind
    }
    #[getter]
    fn schema(&self) -> &str {
        &self.inner.schema
    }
    fn __repr__(&self) -> String {
        format!(
            "OutputConstraint(kind={:?}, schema={:?})",
            self.inner.kind, self.inner.schema
        )
    }
}

#[pyclass(module = "deepring_recipe._native", name = "InferenceOptions", frozen)]
#[derive(Clone)]
pub(crate) struct PyInferenceOptions {
    pub(crate) inner: InferenceOptions,
}

#[pymethods]
impl PyInferenceOptions {
    #[getter]
    fn max_tokens(&self) -> Option<u32> {
        self.inner.max_tokens
    }
    #[getter]
    fn temperature(&self) -> Option<f64> {
        self.inner.temperature.map(f64::from)
    }
    #[getter]
    fn top_p(&self) -> Option<f64> {
        self.inner.top_p.map(f64::from)
    }
    #[getter]
    fn logprobs(&self) -> bool {
        self.inner.logprobs
    }
    #[getter]
    fn top_logprobs(&self) -> Option<u8> {
        self.inner.top_logprobs
    }
    #[getter]
    fn seed(&self) -> Option<u64> {
        self.inner.seed
    }
    #[getter]
    fn output_constraint(&self) -> Option<PyOutputConstraint> {
        self.inner
            .output_constraint
            .clone()
            .map(|inner| PyOutputConstraint { inner })
    }
}

#[pyclass(module = "deepring_recipe._native", name = "ParsingOptions")]
#[derive(Clone)]
pub(crate) struct PyParsingOptions {
    pub(crate) inner: ParsingOptions,
}

#[pymethods]
impl PyParsingOptions {
    #[new]
    #[pyo3(signature = (
        *, parse_tool_calls = true, starts_in_tool_calls = false, parse_json_output = false,
        thinking_initial_stage = None, stop_sequences = None, special_tokens = None
    ))]
    fn new(
        parse_tool_calls: bool,
        starts_in_tool_calls: bool,
        parse_json_output: bool,
        thinking_initial_stage: Option<PyThinkingInitialStage>,
        stop_sequences: Option<Vec<String>>,
        special_tokens: Option<PyRef<'_, PySpecialTokens>>,
    ) -> Self {
        PyParsingOptions {
            inner: ParsingOptions {
                parse_tool_calls,
                starts_in_tool_calls,
                parse_json_output,
                thinking_initial_stage: thinking_initial_stage.map(Into::into),
                stop_sequences: stop_sequences.unwrap_or_default(),
                special_tokens: special_tokens.map(|s| s.inner.clone()).unwrap_or_default(),
            },
        }
    }
    #[getter]
    fn get_parse_tool_calls(&self) -> bool {
        self.inner.parse_tool_calls
    }
    #[setter]
    fn set_parse_tool_calls(&mut self, value: bool) {
        self.inner.parse_tool_calls = value;
    }
    #[getter]
    fn get_starts_in_tool_calls(&self) -> bool {
        self.inner.starts_in_tool_calls
    }
    #[setter]
    fn set_starts_in_tool_calls(&mut self, value: bool) {
        self.inner.starts_in_tool_calls = value;
    }
    #[getter]
    fn get_parse_json_output(&self) -> bool {
        self.inner.parse_json_output
    }
    #[setter]
    fn set_parse_json_output(&mut self, value: bool) {
        self.inner.parse_json_output = value;
    }
    #[getter]
    fn get_thinking_initial_stage(&self) -> Option<PyThinkingInitialStage> {
        self.inner.thinking_initial_stage.map(Into::into)
    }
    #[setter]
    fn set_thinking_initial_stage(&mut self, value: Option<PyThinkingInitialStage>) {
        self.inner.thinking_initial_stage = value.map(Into::into);
    }
    #[getter]
    fn get_stop_sequences(&self) -> Vec<String> {
        self.inner.stop_sequences.clone()
    }
    #[setter]
    fn set_stop_sequences(&mut self, value: Vec<String>) {
        self.inner.stop_sequences = value;
    }
    #[getter]
    fn get_special_tokens(&self) -> PySpecialTokens {
        PySpecialTokens {
            inner: self.inner.special_tokens.clone(),
        }
    }
    #[setter]
    fn set_special_tokens(&mut self, value: PyRef<'_, PySpecialTokens>) {
        self.inner.special_tokens = value.inner.clone();
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyConversionOptions>()?;
    m.add_class::<PyOutputConstraint>()?;
    m.add_class::<PyInferenceOptions>()?;
    m.add_class::<PyParsingOptions>()?;
    Ok(())
}
