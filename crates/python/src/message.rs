//! Message and its subclasses by role: value classes wrapping the core type; a message returned
//! to Python is built with the subclass of its role.

use deepring_recipe::{Message, Role, SpecialToken};
use pyo3::prelude::*;
use pyo3::PyClassInitializer;

use crate::errors;
use crate::image::{image_to_py, images_from_py, PyImageSource};
use crate::json::quoted;
use crate::tool::{tools_to_py, PyToolCall, PyToolDefinition};

#[pyclass(module = "deepring_recipe._native", name = "Message", subclass, frozen)]
#[derive(Clone)]
pub(crate) struct PyMessage {
    pub(crate) inner: Message,
}

#[pymethods]
impl PyMessage {
    #[getter]
    fn role(&self) -> &'static str {
        self.inner.role.as_str()
    }
    #[getter]
    fn content(&self) -> &str {
        &self.inner.content
    }
    #[getter]
    fn reasoning_content(&self) -> Option<&str> {
        self.inner.reasoning_content.as_deref()
    }
    #[getter]
    fn tool_calls(&self, py: Python<'_>) -> PyResult<Option<Vec<Py<PyToolCall>>>> {
        self.inner
            .tool_calls
            .as_ref()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| Py::new(py, PyToolCall { inner: c.clone() }))
                    .collect()
            })
            .transpose()
    }
    #[getter]
    fn tool_call_id(&self) -> Option<&str> {
        self.inner.tool_call_id.as_deref()
    }
    #[getter]
    fn image_sources(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        self.inner
            .image_sources
            .iter()
            .map(|s| image_to_py(py, s))
            .collect()
    }
    #[getter]
    fn prefix(&self) -> bool {
        self.inner.prefix
    }
    fn __repr__(&self) -> String {
        let m = &self.inner;
        match m.role {
            Role::Assistant => format!(
                "AssistantMessage({}, reasoning_content={}, tool_calls={}, prefix={})",
                quoted(&m.content),
                if m.reasoning_content.is_some() {
                    "True"
                } else {
                    "False"
                },
                m.tool_calls.as_ref().map_or(0, Vec::len),
                if m.prefix { "True" } else { "False" },
            ),
            role => format!(
                "{}({}, image_sources={})",
                class_name(role),
                quoted(&m.content),
                m.image_sources.len()
            ),
        }
    }
}

fn class_name(role: Role) -> &'static str {
    match role {
        Role::System => "SystemMessage",
        Role::User => "UserMessage",
        Role::Assistant => "AssistantMessage",
        Role::Tool => "ToolMessage",
        Role::LatestReminder => "LatestReminderMessage",
    }
}

fn image_token(token: Option<String>) -> String {
    token.unwrap_or_else(|| SpecialToken::Image.default_str().to_string())
}

#[pyclass(module = "deepring_recipe._native", name = "SystemMessage", extends = PyMessage, frozen)]
pub(crate) struct PySystemMessage;

#[pymethods]
impl PySystemMessage {
    #[new]
    #[pyo3(signature = (content, image_sources = None, tools = None, *, image_token = None))]
    fn new(
        content: String,
        image_sources: Option<Vec<PyRef<'_, PyImageSource>>>,
        tools: Option<Vec<PyRef<'_, PyToolDefinition>>>,
        image_token: Option<String>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let tools = tools.map(|t| t.iter().map(|t| t.inner.clone()).collect());
        let inner = Message::system(
            content,
            images_from_py(image_sources),
            tools,
            &self::image_token(image_token),
        )
        .map_err(errors::recipe)?;
        Ok(PyClassInitializer::from(PyMessage { inner }).add_subclass(PySystemMessage))
    }
    #[getter]
    fn tools(
        self_: PyRef<'_, Self>,
        py: Python<'_>,
    ) -> PyResult<Option<Vec<Py<PyToolDefinition>>>> {
        let base = self_.as_super();
        base.inner
            .tools
            .as_ref()
            .map(|t| tools_to_py(py, t))
            .transpose()
    }
}

#[pyclass(module = "deepring_recipe._native", name = "UserMessage", extends = PyMessage, frozen)]
pub(crate) struct PyUserMessage;

#[pymethods]
impl PyUserMessage {
    #[new]
    #[pyo3(signature = (content, image_sources = None, *, image_token = None))]
    fn new(
        content: String,
        image_sources: Option<Vec<PyRef<'_, PyImageSource>>>,
        image_token: Option<String>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let inner = Message::user(
            content,
            images_from_py(image_sources),
            &self::image_token(image_token),
        )
        .map_err(errors::recipe)?;
        Ok(PyClassInitializer::from(PyMessage { inner }).add_subclass(PyUserMessage))
    }
}

#[pyclass(module = "deepring_recipe._native", name = "AssistantMessage", extends = PyMessage, frozen)]
pub(crate) struct PyAssistantMessage;

#[pymethods]
impl PyAssistantMessage {
    #[new]
    #[pyo3(signature = (content, reasoning_content = None, tool_calls = None, prefix = false))]
    fn new(
        content: String,
        reasoning_content: Option<String>,
        tool_calls: Option<Vec<PyRef<'_, PyToolCall>>>,
        prefix: bool,
    ) -> PyClassInitializer<Self> {
        let tool_calls = tool_calls.map(|c| c.iter().map(|c| c.inner.clone()).collect());
        let inner = Message::assistant(content, reasoning_content, tool_calls, prefix);
        PyClassInitializer::from(PyMessage { inner }).add_subclass(PyAssistantMessage)
    }
}

#[pyclass(module = "deepring_recipe._native", name = "ToolMessage", extends = PyMessage, frozen)]
pub(crate) struct PyToolMessage;

#[pymethods]
impl PyToolMessage {
    #[new]
    #[pyo3(signature = (content, tool_call_id = None, image_sources = None, *, image_token = None))]
    fn new(
        content: String,
        tool_call_id: Option<String>,
        image_sources: Option<Vec<PyRef<'_, PyImageSource>>>,
        image_token: Option<String>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let inner = Message::tool(
            content,
            tool_call_id,
            images_from_py(image_sources),
            &self::image_token(image_token),
        )
        .map_err(errors::recipe)?;
        Ok(PyClassInitializer::from(PyMessage { inner }).add_subclass(PyToolMessage))
    }
}

#[pyclass(module = "deepring_recipe._native", name = "LatestReminderMessage", extends = PyMessage, frozen)]
pub(crate) struct PyLatestReminderMessage;

#[pymethods]
impl PyLatestReminderMessage {
    #[new]
    fn new(content: String) -> PyClassInitializer<Self> {
        PyClassInitializer::from(PyMessage {
            inner: Message::latest_reminder(content),
        })
        .add_subclass(PyLatestReminderMessage)
    }
}

pub(crate) fn message_to_py(py: Python<'_>, message: &Message) -> PyResult<Py<PyAny>> {
    let init = PyClassInitializer::from(PyMessage {
        inner: message.clone(),
    });
    Ok(match message.role {
        Role::System => Bound::new(py, init.add_subclass(PySystemMessage))?.into_any(),
        Role::User => Bound::new(py, init.add_subclass(PyUserMessage))?.into_any(),
        Role::Assistant => Bound::new(py, init.add_subclass(PyAssistantMessage))?.into_any(),
        Role::Tool => Bound::new(py, init.add_subclass(PyToolMessage))?.into_any(),
        Role::LatestReminder => {
            Bound::new(py, init.add_subclass(PyLatestReminderMessage))?.into_any()
        }
    }
    .unbind())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMessage>()?;
    m.add_class::<PySystemMessage>()?;
    m.add_class::<PyUserMessage>()?;
    m.add_class::<PyAssistantMessage>()?;
    m.add_class::<PyToolMessage>()?;
    m.add_class::<PyLatestReminderMessage>()?;
    Ok(())
}
