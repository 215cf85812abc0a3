//! Conversation: the value class wrapping the core conversation (messages, tools, tool choice,
//! reasoning effort, response format).

use deepring_recipe::{Conversation, ReasoningEffort, ResponseFormat, ToolChoice};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::json::{quoted, to_json, to_py};
use crate::message::{message_to_py, PyMessage};
use crate::tool::{tools_from_py, tools_to_py, PyToolDefinition};

#[pyclass(
    module = "deepring_recipe._native",
    name = "Conversation",
    frozen,
    freelist = 16
)]
#[derive(Clone)]
pub(crate) struct PyConversation {
    pub(crate) inner: std::sync::Arc<Conversation>,
}

fn parse_tool_choice(s: &str) -> PyResult<ToolChoice> {
    Ok(match s {
        "auto" => ToolChoice::Auto,
        "none" => ToolChoice::None,
        "required" => ToolChoice::Required,
        _ => {
            return Err(PyValueError::new_err(format!(
                "invalid tool_choice \"{s}\"; expected \"auto\", \"none\", or \"required\""
            )))
        }
    })
}

#[pymethods]
impl PyConversation {
    #[new]
    #[pyo3(signature = (
        messages = None, *, thinking_mode = true, tools = None, tool_choice = "auto",
        reasoning_effort = None, response_format = "text", response_schema = None,
        response_regex = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        messages: Option<Vec<PyRef<'_, PyMessage>>>,
        thinking_mode: bool,
        tools: Option<Vec<PyRef<'_, PyToolDefinition>>>,
        tool_choice: &str,
        reasoning_effort: Option<&str>,
        response_format: &str,
        response_schema: Option<&Bound<'_, PyAny>>,
        response_regex: Option<String>,
    ) -> PyResult<Self> {
        let tool_choice = parse_tool_choice(tool_choice)?;
        let reasoning_effort = reasoning_effort
            .map(|e| {
                ReasoningEffort::parse(e).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "invalid reasoning_effort \"{e}\"; expected \"low\", \"high\", \"xhigh\", or \"max\""
                    ))
                })
            })
            .transpose()?;
        let json_object = match response_format {
            "text" => false,
            "json_object" => true,
            other => {
                return Err(PyValueError::new_err(format!(
                    "invalid response_format \"{other}\"; expected \"text\" or \"json_object\""
                )))
            }
        };
        let response_schema = response_schema.filter(|s| !s.is_none());
        if json_object && (response_schema.is_some() || response_regex.is_some()) {
            return Err(PyValueError::new_err(
                "response_format \"json_object\" cannot be combined with response_schema or response_regex",
            ));
        }
        let response_format = match (response_schema, response_regex) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err(
                    "response_schema and response_regex cannot be combined",
                ))
            }
            (Some(schema), None) => ResponseFormat::JsonSchema(to_json(schema)?),
            (None, Some(regex)) => ResponseFormat::Regex(regex),
            (None, None) if json_object => ResponseFormat::JsonObject,
            (None, None) => ResponseFormat::Text,
        };
        Ok(PyConversation {
            inner: std::sync::Arc::new(Conversation {
                messages: messages
                    .map(|m| m.iter().map(|m| m.inner.clone()).collect())
                    .unwrap_or_default(),
                thinking_mode,
                tools: tools_from_py(tools),
                tool_choice,
                reasoning_effort,
                response_format,
            }),
        })
    }
    #[getter]
    fn messages(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        self.inner
            .messages
            .iter()
            .map(|m| message_to_py(py, m))
            .collect()
    }
    #[getter]
    fn thinking_mode(&self) -> bool {
        self.inner.thinking_mode
    }
    #[getter]
    fn tools(&self, py: Python<'_>) -> PyResult<Vec<Py<PyToolDefinition>>> {
        tools_to_py(py, &self.inner.tools)
    }
    #[getter]
    fn tool_choice(&self) -> &'static str {
        self.inner.tool_choice.as_str()
    }
    #[getter]
    fn reasoning_effort(&self) -> Option<&'static str> {
        self.inner.reasoning_effort.map(ReasoningEffort::as_str)
    }
    #[getter]
    fn response_format(&self) -> &'static str {
        self.inner.response_format.name()
    }
    #[getter]
    fn response_schema<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match &self.inner.response_format {
            ResponseFormat::JsonSchema(s) => Ok(Some(to_py(py, s)?)),
            _ => Ok(None),
        }
    }
    #[getter]
    fn response_regex(&self) -> Option<&str> {
        match &self.inner.response_format {
            ResponseFormat::Regex(r) => Some(r),
            _ => None,
        }
    }
    fn __repr__(&self) -> String {
        let c = &self.inner;
        format!(
            "Conversation(messages={}, thinking_mode={}, tools={}, tool_choice={}, reasoning_effort={}, response_format={})",
            c.messages.len(),
            if c.thinking_mode { "True" } else { "False" },
            c.tools.len(),
            quoted(c.tool_choice.as_str()),
            c.reasoning_effort.map_or("None".into(), |e| quoted(e.as_str())),
            quoted(c.response_format.name()),
        )
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyConversation>()?;
    Ok(())
}
