//! Protocol request classes (single use) and ConversationRequest.

use std::sync::Mutex;

use deepring_recipe::request::chat::ChatCompletionRequest;
use deepring_recipe::request::{
    outline, outline_value, pick_fields, ConversationRequest, ConversionOptions, Outline,
    RequestBody,
};
use deepring_recipe::ConversionError;
use deepring_recipe::RecipeError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyFrozenSet, PyList, PyString};

use crate::conversation::PyConversation;
use crate::detach::maybe_detached;
use crate::enums::PyModelVersion;
use crate::errors;
use crate::json::{to_json, to_py};
use crate::options::{PyConversionOptions, PyInferenceOptions, PyParsingOptions};
use crate::stream::{self, PyChatCompletionChunkGenerator};

const CONSUMED: &str = "protocol request has been consumed";

/// Read a request body (`bytes | str | dict`) into a protocol request with `parse`; also the
/// body's size for [`maybe_detached`] (a dict counts as large: its size is not known).
pub(crate) fn parse_request<T>(
    py: Python<'_>,
    body: &Bound<'_, PyAny>,
    parse: impl Fn(RequestBody<'_>) -> Result<T, RecipeError> + Send + Sync,
) -> PyResult<(T, usize)>
where
    T: Send,
{
    let (result, size) = if let Ok(s) = body.cast::<PyString>() {
        let text = s.to_str()?;
        let size = text.len();
        (
            maybe_detached(py, size, || parse(RequestBody::Text(text.as_bytes()))),
            size,
        )
    } else if let Ok(b) = body.cast::<PyBytes>() {
        let bytes = b.as_bytes();
        let size = bytes.len();
        (
            maybe_detached(py, size, || parse(RequestBody::Text(bytes))),
            size,
        )
    } else {
        let value = to_json(body)?;
        (py.detach(|| parse(RequestBody::Value(value))), usize::MAX)
    };
    result.map(|r| (r, size)).map_err(errors::recipe)
}

/// Convert the request in `slot` (consuming it) with the GIL released for large bodies; errors
/// mapped in one place. Requests are kept boxed (see `parse_body_boxed`).
fn convert_taken<T: Send>(
    py: Python<'_>,
    slot: &Mutex<Option<Box<T>>>,
    size: usize,
    options: &ConversionOptions,
    convert: impl FnOnce(T, &ConversionOptions) -> Result<ConversationRequest, ConversionError> + Send,
) -> PyResult<PyConversationRequest> {
    let request = take(slot)?;
    maybe_detached(py, size, || convert(*request, options))
        .map(|inner| PyConversationRequest { inner })
        .map_err(|e| errors::conversion(&e))
}

/// Take the request out of its slot, or fail if a previous `convert` consumed it.
pub(crate) fn take<T>(slot: &Mutex<Option<T>>) -> PyResult<T> {
    slot.lock()
        .map_err(|_| PyRuntimeError::new_err(CONSUMED))?
        .take()
        .ok_or_else(|| PyRuntimeError::new_err(CONSUMED))
}

pub(crate) fn peek<T, R>(slot: &Mutex<Option<T>>, f: impl FnOnce(&T) -> R) -> PyResult<R> {
    let guard = slot.lock().map_err(|_| PyRuntimeError::new_err(CONSUMED))?;
    guard
        .as_ref()
        .map(f)
        .ok_or_else(|| PyRuntimeError::new_err(CONSUMED))
}

// The request classes, ConversationRequest, Conversation and RenderedPrompt keep freelists: one
// request makes one of each, short-lived, and reusing their memory saves an allocation apiece.
#[pyclass(
    module = "deepring_recipe._native",
    name = "ConversationRequest",
    frozen,
    freelist = 16
)]
#[derive(Clone)]
pub(crate) struct PyConversationRequest {
    pub(crate) inner: ConversationRequest,
}

#[pymethods]
impl PyConversationRequest {
    #[new]
    fn new(conversation: PyRef<'_, PyConversation>, model_version: PyModelVersion) -> Self {
        PyConversationRequest {
            inner: ConversationRequest::new((*conversation.inner).clone(), model_version.into()),
        }
    }
    #[getter]
    fn conversation(&self) -> PyConversation {
        PyConversation {
            inner: std::sync::Arc::clone(&self.inner.conversation),
        }
    }
    #[getter]
    fn inference_options(&self) -> PyInferenceOptions {
        PyInferenceOptions {
            inner: self.inner.inference_options.clone(),
        }
    }
    #[getter]
    fn parsing_options(&self) -> PyParsingOptions {
        PyParsingOptions {
            inner: self.inner.parsing_options.clone(),
        }
    }
    #[getter]
    fn model_version(&self) -> PyModelVersion {
        self.inner.model_version.into()
    }
    #[getter]
    fn stream(&self) -> bool {
        self.inner.stream
    }
    fn resolve_max_tokens(&self, prompt_tokens: u32, context_limit: u32) -> PyResult<u64> {
        self.inner
            .resolve_max_tokens(u64::from(prompt_tokens), u64::from(context_limit))
            .map_err(|e| errors::conversion(&e))
    }
}

#[pyclass(
    module = "deepring_recipe._native",
    name = "ChatCompletionRequest",
    frozen,
    freelist = 16
)]
pub(crate) struct PyChatCompletionRequest {
    slot: Mutex<Option<Box<ChatCompletionRequest>>>,
    size: usize,
}

#[pymethods]
impl PyChatCompletionRequest {
    #[new]
    fn new(py: Python<'_>, body: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (request, size) = parse_request(py, body, ChatCompletionRequest::from_body_boxed)?;
        Ok(PyChatCompletionRequest {
            slot: Mutex::new(Some(request)),
            size,
        })
    }
    #[getter]
    fn model(&self) -> PyResult<String> {
        peek(&self.slot, |r| r.model.clone())
    }
    fn convert(
        &self,
        py: Python<'_>,
        options: PyRef<'_, PyConversionOptions>,
    ) -> PyResult<PyConversationRequest> {
        convert_taken(
            py,
            &self.slot,
            self.size,
            &options.inner,
            ChatCompletionRequest::convert,
        )
    }
    #[staticmethod]
    fn chunk_generator(
        request: PyRef<'_, PyConversationRequest>,
        id: String,
        model: String,
    ) -> PyChatCompletionChunkGenerator {
        stream::chat_chunk_generator(&request.inner, id, model)
    }
}

/// The named top-level fields of a request body (`bytes | str | dict`) that are present, as a
/// dict of Python values: what a server reads besides the protocol request (sampling extensions
/// such as `top_k`). Text bodies are scanned once without building the other values, with the
/// GIL released when large; ValueError for text that is not JSON.
#[pyfunction]
fn request_fields<'py>(
    py: Python<'py>,
    body: &Bound<'py, PyAny>,
    names: Vec<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    if let Ok(dict) = body.cast::<PyDict>() {
        for name in &names {
            if let Some(value) = dict.get_item(name)? {
                out.set_item(name, value)?;
            }
        }
        return Ok(out);
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let picked = if let Ok(s) = body.cast::<PyString>() {
        let text = s.to_str()?;
        maybe_detached(py, text.len(), || pick_fields(text.as_bytes(), &names))
    } else {
        let bytes = body.cast::<PyBytes>()?.as_bytes();
        maybe_detached(py, bytes.len(), || pick_fields(bytes, &names))
    };
    for (name, value) in picked.map_err(errors::recipe)? {
        out.set_item(name, to_py(py, &value)?)?;
    }
    Ok(out)
}

/// The outline of a request body (`bytes | str | dict`), read in one scan: its top-level keys
/// (each once, in order), the string values of every `type` key at any depth (a frozenset), and
/// the named top-level fields that are present (a dict, as `request_fields`). What a server
/// needs to refuse unknown fields and content it cannot serve without reading the body twice:
/// text bodies are scanned without building anything but the named fields, with the GIL
/// released when large. ValueError for text that is not JSON.
#[pyfunction]
fn request_outline<'py>(
    py: Python<'py>,
    body: &Bound<'py, PyAny>,
    names: Vec<String>,
) -> PyResult<(
    Bound<'py, PyList>,
    Bound<'py, PyFrozenSet>,
    Bound<'py, PyDict>,
)> {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let got: Outline = if let Ok(s) = body.cast::<PyString>() {
        let text = s.to_str()?;
        maybe_detached(py, text.len(), || outline(text.as_bytes(), &names))
            .map_err(errors::recipe)?
    } else if let Ok(b) = body.cast::<PyBytes>() {
        let bytes = b.as_bytes();
        maybe_detached(py, bytes.len(), || outline(bytes, &names)).map_err(errors::recipe)?
    } else {
        let value = to_json(body)?;
        py.detach(|| outline_value(&value, &names))
    };
    let fields = PyDict::new(py);
    for (name, value) in &got.fields {
        fields.set_item(name, to_py(py, value)?)?;
    }
    let keys = PyList::new(py, &got.keys)?;
    let tags = PyFrozenSet::new(py, &got.tags)?;
    Ok((keys, tags, fields))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyConversationRequest>()?;
    m.add_class::<PyChatCompletionRequest>()?;
    m.add_function(wrap_pyfunction!(request_fields, m)?)?;
    m.add_function(wrap_pyfunction!(request_outline, m)?)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Responses

use crate::echo::{responses_echo, PyResponsesEcho};
use deepring_recipe::request::responses::ResponsesRequest;
use pyo3::types::PyTuple;

#[pyclass(
    module = "deepring_recipe._native",
    name = "ResponsesRequest",
    frozen,
    freelist = 16
)]
pub(crate) struct PyResponsesRequest {
    slot: Mutex<Option<Box<ResponsesRequest>>>,
    size: usize,
}

#[pymethods]
impl PyResponsesRequest {
    #[new]
    fn new(py: Python<'_>, body: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (request, size) = parse_request(py, body, ResponsesRequest::from_body_boxed)?;
        Ok(PyResponsesRequest {
            slot: Mutex::new(Some(request)),
            size,
        })
    }
    #[getter]
    fn model(&self) -> PyResult<String> {
        peek(&self.slot, |r| r.model.clone())
    }
    fn namespace_tool_map<'py>(
        &self,
        py: Python<'py>,
        options: PyRef<'_, PyConversionOptions>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let entries = peek(&self.slot, |r| r.namespace_tool_map(&options.inner))?
            .map_err(|e| errors::conversion(&e))?;
        let dict = PyDict::new(py);
        for (full, ns, name) in entries {
            dict.set_item(full, PyTuple::new(py, [ns, name])?)?;
        }
        Ok(dict)
    }
    fn echo(&self) -> PyResult<PyResponsesEcho> {
        peek(&self.slot, |r| responses_echo(r.echo()))
    }
    fn convert(
        &self,
        py: Python<'_>,
        options: PyRef<'_, PyConversionOptions>,
    ) -> PyResult<PyConversationRequest> {
        convert_taken(
            py,
            &self.slot,
            self.size,
            &options.inner,
            ResponsesRequest::convert,
        )
    }
    #[staticmethod]
    fn chunk_generator(
        request: PyRef<'_, PyConversationRequest>,
        id: String,
        model: String,
    ) -> crate::stream::PyResponsesChunkGenerator {
        crate::stream::responses_chunk_generator(&request.inner, id, model)
    }
}

pub(crate) fn register_responses(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyResponsesRequest>()?;
    m.add_class::<PyMessagesRequest>()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Messages

use deepring_recipe::request::messages::MessagesRequest;

#[pyclass(
    module = "deepring_recipe._native",
    name = "MessagesRequest",
    frozen,
    freelist = 16
)]
pub(crate) struct PyMessagesRequest {
    slot: Mutex<Option<Box<MessagesRequest>>>,
    size: usize,
}

#[pymethods]
impl PyMessagesRequest {
    #[new]
    fn new(py: Python<'_>, body: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (request, size) = parse_request(py, body, MessagesRequest::from_body_boxed)?;
        Ok(PyMessagesRequest {
            slot: Mutex::new(Some(request)),
            size,
        })
    }
    #[getter]
    fn model(&self) -> PyResult<String> {
        peek(&self.slot, |r| r.model.clone())
    }
    fn convert(
        &self,
        py: Python<'_>,
        options: PyRef<'_, PyConversionOptions>,
    ) -> PyResult<PyConversationRequest> {
        convert_taken(
            py,
            &self.slot,
            self.size,
            &options.inner,
            MessagesRequest::convert,
        )
    }
    #[staticmethod]
    fn chunk_generator(
        request: PyRef<'_, PyConversationRequest>,
        id: String,
        model: String,
    ) -> crate::stream::PyMessagesChunkGenerator {
        crate::stream::messages_chunk_generator(&request.inner, id, model)
    }
}
