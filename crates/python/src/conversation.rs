//! Conversation value classes: tool calls and definitions, image sources, messages, Conversation.
//! Each wraps the core type; subclasses are built with the right Python class when returned.

use deepring_recipe::{
    Conversation, ImageData, ImageDetail, ImageSource, Message, ReasoningEffort, ResponseFormat,
    Role, SpecialToken, ToolCall, ToolChoice, ToolDefinition,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::PyClassInitializer;
use serde_json::Value;

use crate::errors;
use crate::json::{to_json, to_py};

fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

// ---------------------------------------------------------------------------------------------
// Tool calls and tool definitions

#[pyclass(module = "deepring_recipe._native", name = "ToolCall", frozen)]
#[derive(Clone)]
pub(crate) struct PyToolCall {
    pub(crate) inner: ToolCall,
}

#[pymethods]
impl PyToolCall {
    #[new]
    fn new(id: String, name: String, arguments: String) -> Self {
        PyToolCall {
            inner: ToolCall {
                id,
                name,
                arguments,
            },
        }
    }
    #[getter]
    fn id(&self) -> &str {
        &self.inner.id
    }
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    #[getter]
    fn arguments(&self) -> &str {
        &self.inner.arguments
    }
    fn __repr__(&self) -> String {
        format!(
            "ToolCall(id={}, name={}, arguments={})",
            quoted(&self.inner.id),
            quoted(&self.inner.name),
            quoted(&self.inner.arguments)
        )
    }
}

#[pyclass(module = "deepring_recipe._native", name = "ToolDefinition", frozen)]
#[derive(Clone)]
pub(crate) struct PyToolDefinition {
    pub(crate) inner: ToolDefinition,
}

#[pymethods]
impl PyToolDefinition {
    #[new]
    #[pyo3(signature = (name, description = None, parameters = None, strict = None, defer_loading = false))]
    fn new(
        name: String,
        description: Option<String>,
        parameters: Option<&Bound<'_, PyAny>>,
        strict: Option<bool>,
        defer_loading: bool,
    ) -> PyResult<Self> {
        let parameters = match parameters {
            Some(p) => to_json(p)?,
            None => Value::Null,
        };
        Ok(PyToolDefinition {
            inner: ToolDefinition {
                name,
                description,
                parameters,
                strict,
                defer_loading,
            },
        })
    }
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    #[getter]
    fn description(&self) -> Option<&str> {
        self.inner.description.as_deref()
    }
    #[getter]
    fn parameters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.inner.parameters)
    }
    #[getter]
    fn strict(&self) -> Option<bool> {
        self.inner.strict
    }
    #[getter]
    fn defer_loading(&self) -> bool {
        self.inner.defer_loading
    }
    fn __repr__(&self) -> String {
        format!(
            "ToolDefinition(name={}, description={}, strict={})",
            quoted(&self.inner.name),
            self.inner
                .description
                .as_deref()
                .map_or("None".into(), quoted),
            match self.inner.strict {
                Some(true) => "True",
                Some(false) => "False",
                None => "None",
            }
        )
    }
}

pub(crate) fn tools_from_py(
    tools: Option<Vec<PyRef<'_, PyToolDefinition>>>,
) -> Vec<ToolDefinition> {
    tools
        .map(|t| t.iter().map(|t| t.inner.clone()).collect())
        .unwrap_or_default()
}

pub(crate) fn tools_to_py(
    py: Python<'_>,
    tools: &[ToolDefinition],
) -> PyResult<Vec<Py<PyToolDefinition>>> {
    tools
        .iter()
        .map(|t| Py::new(py, PyToolDefinition { inner: t.clone() }))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Image sources

#[pyclass(
    module = "deepring_recipe._native",
    name = "ImageSource",
    subclass,
    frozen
)]
#[derive(Clone)]
pub(crate) struct PyImageSource {
    pub(crate) inner: ImageSource,
}

fn parse_detail(detail: &str) -> PyResult<ImageDetail> {
    ImageDetail::parse(detail).ok_or_else(|| {
        PyValueError::new_err(format!(
            "invalid detail \"{detail}\"; expected \"low\", \"high\", \"original\", or \"auto\""
        ))
    })
}

#[pymethods]
impl PyImageSource {
    #[getter]
    fn kind(&self) -> &'static str {
        match self.inner.data {
            ImageData::DataUrl(_) => "data_url",
            ImageData::Url(_) => "url",
            ImageData::Bytes(_) => "bytes",
        }
    }
    #[getter]
    fn detail(&self) -> &'static str {
        self.inner.detail.as_str()
    }
    #[getter]
    fn data_url(&self) -> Option<&str> {
        match &self.inner.data {
            ImageData::DataUrl(u) => Some(u),
            _ => None,
        }
    }
    #[getter]
    fn url(&self) -> Option<&str> {
        match &self.inner.data {
            ImageData::Url(u) => Some(u),
            _ => None,
        }
    }
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        match &self.inner.data {
            ImageData::Bytes(b) => Some(PyBytes::new(py, b)),
            _ => None,
        }
    }
    #[getter]
    fn path(&self) -> &str {
        &self.inner.path
    }
    fn __repr__(&self) -> String {
        let (class, value) = match &self.inner.data {
            ImageData::DataUrl(u) => ("DataUrlImageSource", quoted(u)),
            ImageData::Url(u) => ("UrlImageSource", quoted(u)),
            ImageData::Bytes(b) => ("BytesImageSource", format!("<{} bytes>", b.len())),
        };
        format!(
            "{class}({value}, detail={}, path={})",
            quoted(self.inner.detail.as_str()),
            quoted(&self.inner.path)
        )
    }
}

#[pyclass(module = "deepring_recipe._native", name = "DataUrlImageSource", extends = PyImageSource, frozen)]
pub(crate) struct PyDataUrlImageSource;

#[pymethods]
impl PyDataUrlImageSource {
    #[new]
    #[pyo3(signature = (data_url, detail = "high", *, path = String::new()))]
    fn new(data_url: String, detail: &str, path: String) -> PyResult<PyClassInitializer<Self>> {
        let inner = ImageSource {
            data: ImageData::DataUrl(data_url),
            detail: parse_detail(detail)?,
            path,
        };
        Ok(PyClassInitializer::from(PyImageSource { inner }).add_subclass(PyDataUrlImageSource))
    }
}

#[pyclass(module = "deepring_recipe._native", name = "UrlImageSource", extends = PyImageSource, frozen)]
pub(crate) struct PyUrlImageSource;

#[pymethods]
impl PyUrlImageSource {
    #[new]
    #[pyo3(signature = (url, detail = "high", *, path = String::new()))]
    fn new(url: String, detail: &str, path: String) -> PyResult<PyClassInitializer<Self>> {
        let inner = ImageSource {
            data: ImageData::Url(url),
            detail: parse_detail(detail)?,
            path,
        };
        Ok(PyClassInitializer::from(PyImageSource { inner }).add_subclass(PyUrlImageSource))
    }
}

#[pyclass(module = "deepring_recipe._native", name = "BytesImageSource", extends = PyImageSource, frozen)]
pub(crate) struct PyBytesImageSource;

#[pymethods]
impl PyBytesImageSource {
    #[new]
    #[pyo3(signature = (data, detail = "high", *, path = String::new()))]
    fn new(data: Vec<u8>, detail: &str, path: String) -> PyResult<PyClassInitializer<Self>> {
        let inner = ImageSource {
            data: ImageData::Bytes(data),
            detail: parse_detail(detail)?,
            path,
        };
        Ok(PyClassInitializer::from(PyImageSource { inner }).add_subclass(PyBytesImageSource))
    }
}

pub(crate) fn image_to_py(py: Python<'_>, source: &ImageSource) -> PyResult<Py<PyAny>> {
    let base = PyImageSource {
        inner: source.clone(),
    };
    let init = PyClassInitializer::from(base);
    Ok(match source.data {
        ImageData::DataUrl(_) => {
            Bound::new(py, init.add_subclass(PyDataUrlImageSource))?.into_any()
        }
        ImageData::Url(_) => Bound::new(py, init.add_subclass(PyUrlImageSource))?.into_any(),
        ImageData::Bytes(_) => Bound::new(py, init.add_subclass(PyBytesImageSource))?.into_any(),
    }
    .unbind())
}

fn images_from_py(images: Option<Vec<PyRef<'_, PyImageSource>>>) -> Vec<ImageSource> {
    images
        .map(|v| v.iter().map(|i| i.inner.clone()).collect())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Messages

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

// ---------------------------------------------------------------------------------------------
// Conversation

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
    m.add_class::<PyToolCall>()?;
    m.add_class::<PyToolDefinition>()?;
    m.add_class::<PyImageSource>()?;
    m.add_class::<PyDataUrlImageSource>()?;
    m.add_class::<PyUrlImageSource>()?;
    m.add_class::<PyBytesImageSource>()?;
    m.add_class::<PyMessage>()?;
    m.add_class::<PySystemMessage>()?;
    m.add_class::<PyUserMessage>()?;
    m.add_class::<PyAssistantMessage>()?;
    m.add_class::<PyToolMessage>()?;
    m.add_class::<PyLatestReminderMessage>()?;
    m.add_class::<PyConversation>()?;
    Ok(())
}
