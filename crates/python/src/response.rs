//! Protocol events (`ChatCompletionChunk`, `ResponsesStreamEvent`, `MessagesStreamEvent`) and the
//! responses that accumulate them. An event is consumed by `accumulate`, as in deepseek-recipe.

use deepring_recipe::response::{
    ChatCompletionChunk, ChatCompletionResponse, MessagesResponse, MessagesStreamEvent,
    ResponsesResponse, ResponsesStreamEvent,
};
use pyo3::prelude::*;

use crate::errors;

macro_rules! event_class {
    ($py:ident, $name:literal, $core:ty) => {
        #[pyclass(module = "deepring_recipe._native", name = $name)]
        pub(crate) struct $py {
            pub(crate) inner: Option<$core>,
        }

        impl $py {
            pub(crate) fn get(&self) -> PyResult<&$core> {
                self.inner.as_ref().ok_or_else(errors::chunk_consumed)
            }
        }

        #[pymethods]
        impl $py {
            fn to_json(&self) -> PyResult<String> {
                Ok(self.get()?.to_json())
            }
        }
    };
}

event_class!(
    PyChatCompletionChunk,
    "ChatCompletionChunk",
    ChatCompletionChunk
);
event_class!(
    PyResponsesStreamEvent,
    "ResponsesStreamEvent",
    ResponsesStreamEvent
);
event_class!(
    PyMessagesStreamEvent,
    "MessagesStreamEvent",
    MessagesStreamEvent
);

#[pyclass(module = "deepring_recipe._native", name = "ChatCompletionResponse")]
pub(crate) struct PyChatCompletionResponse {
    inner: ChatCompletionResponse,
}

#[pymethods]
impl PyChatCompletionResponse {
    #[new]
    #[allow(unused_variables)]
    fn new(
        id: String,
        model: String,
        created: u64,
        prompt_tokens: u64,
        prompt_cache_hit_tokens: u64,
    ) -> Self {
        PyChatCompletionResponse {
            inner: ChatCompletionResponse::new(id, model, created),
        }
    }
    fn accumulate(&mut self, mut chunk: PyRefMut<'_, PyChatCompletionChunk>) -> PyResult<()> {
        let chunk = chunk.inner.take().ok_or_else(errors::chunk_consumed)?;
        self.inner.accumulate(&chunk);
        Ok(())
    }
    fn to_json(&self) -> String {
        self.inner.to_json()
    }
    #[staticmethod]
    fn sse_event_name(chunk: PyRef<'_, PyChatCompletionChunk>) -> PyResult<Option<String>> {
        chunk.get().map(|_| None)
    }
    #[staticmethod]
    fn sse_done_data() -> Option<&'static str> {
        Some("[DONE]")
    }
}

#[pyclass(module = "deepring_recipe._native", name = "ResponsesResponse")]
pub(crate) struct PyResponsesResponse {
    inner: ResponsesResponse,
}

#[pymethods]
impl PyResponsesResponse {
    #[new]
    #[allow(unused_variables)]
    fn new(
        id: String,
        model: String,
        created: u64,
        prompt_tokens: u64,
        prompt_cache_hit_tokens: u64,
    ) -> Self {
        PyResponsesResponse {
            inner: ResponsesResponse::new(id, model, created),
        }
    }
    fn accumulate(&mut self, mut chunk: PyRefMut<'_, PyResponsesStreamEvent>) -> PyResult<()> {
        let event = chunk.inner.take().ok_or_else(errors::chunk_consumed)?;
        self.inner.accumulate(&event);
        Ok(())
    }
    fn to_json(&self) -> String {
        self.inner.to_json()
    }
    #[staticmethod]
    fn sse_event_name(chunk: PyRef<'_, PyResponsesStreamEvent>) -> PyResult<Option<&'static str>> {
        chunk.get().map(|e| Some(e.event_type()))
    }
    #[staticmethod]
    fn sse_done_data() -> Option<&'static str> {
        None
    }
}

#[pyclass(module = "deepring_recipe._native", name = "MessagesResponse")]
pub(crate) struct PyMessagesResponse {
    inner: MessagesResponse,
}

#[pymethods]
impl PyMessagesResponse {
    #[new]
    fn new(
        id: String,
        model: String,
        created: u64,
        prompt_tokens: u64,
        prompt_cache_hit_tokens: u64,
    ) -> Self {
        let _ = created;
        PyMessagesResponse {
            inner: MessagesResponse::new(id, model, prompt_tokens, prompt_cache_hit_tokens),
        }
    }
    fn accumulate(&mut self, mut chunk: PyRefMut<'_, PyMessagesStreamEvent>) -> PyResult<()> {
        let event = chunk.inner.take().ok_or_else(errors::chunk_consumed)?;
        self.inner.accumulate(&event);
        Ok(())
    }
    fn to_json(&self) -> String {
        self.inner.to_json()
    }
    #[staticmethod]
    fn sse_event_name(chunk: PyRef<'_, PyMessagesStreamEvent>) -> PyResult<Option<&'static str>> {
        chunk.get().map(|e| Some(e.event_type()))
    }
    #[staticmethod]
    fn sse_done_data() -> Option<&'static str> {
        None
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyChatCompletionChunk>()?;
    m.add_class::<PyResponsesStreamEvent>()?;
    m.add_class::<PyMessagesStreamEvent>()?;
    m.add_class::<PyChatCompletionResponse>()?;
    m.add_class::<PyResponsesResponse>()?;
    m.add_class::<PyMessagesResponse>()?;
    Ok(())
}
