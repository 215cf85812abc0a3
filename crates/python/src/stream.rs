//! Streaming: inference chunks, the chunk generators and `StreamProcessor` (`ResponsesEcho` is
//! in `echo`).
//!
//! Generators are single use: a `with_*` builder or a processor consumes them. Pushing a large
//! chunk releases the GIL; a single token is cheaper to process than to hand over.

use std::collections::HashMap;

use deepring_recipe::request::ConversationRequest;
use deepring_recipe::stream::{
    ChatCompletionChunkGenerator, ChunkGenerator, InferenceChunk, InferenceFinishReason,
    MessagesChunkGenerator, PromptUsage, ResponsesChunkGenerator, StreamError, StreamProcessor,
    TokenLogprob,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::echo::PyResponsesEcho;
use crate::errors;
use crate::options::PyParsingOptions;
use crate::response::{PyChatCompletionChunk, PyMessagesStreamEvent, PyResponsesStreamEvent};
use crate::tokenizer::PyTokenizer;

/// One `(logprob, [(id, logprob), …])` pair per token id, as Python passes them.
type PyLogprobs = Vec<(f64, Vec<(u32, f64)>)>;

/// Chunks at least this big are processed with the GIL released.
const DETACH_BYTES: usize = 4096;

#[pyclass(module = "deepring_recipe._native", name = "PromptUsage", frozen)]
#[derive(Clone, Copy)]
pub(crate) struct PyPromptUsage {
    inner: PromptUsage,
}

#[pymethods]
impl PyPromptUsage {
    #[new]
    #[pyo3(signature = (*, prompt_tokens = 0, prompt_cache_hit_tokens = 0))]
    fn new(prompt_tokens: u64, prompt_cache_hit_tokens: u64) -> Self {
        PyPromptUsage {
            inner: PromptUsage {
                prompt_tokens,
                prompt_cache_hit_tokens,
            },
        }
    }
    #[getter]
    fn prompt_tokens(&self) -> u64 {
        self.inner.prompt_tokens
    }
    #[getter]
    fn prompt_cache_hit_tokens(&self) -> u64 {
        self.inner.prompt_cache_hit_tokens
    }
}

/// Backend finish reasons (comparable, not hashable, not equal to ints: as the official).
#[pyclass(
    eq,
    frozen,
    from_py_object,
    module = "deepring_recipe._native",
    name = "InferenceFinishReason"
)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PyInferenceFinishReason {
    Stop,
    Length,
    ContentFilter,
}

impl From<PyInferenceFinishReason> for InferenceFinishReason {
    fn from(v: PyInferenceFinishReason) -> Self {
        match v {
            PyInferenceFinishReason::Stop => InferenceFinishReason::Stop,
            PyInferenceFinishReason::Length => InferenceFinishReason::Length,
            PyInferenceFinishReason::ContentFilter => InferenceFinishReason::ContentFilter,
        }
    }
}

impl From<InferenceFinishReason> for PyInferenceFinishReason {
    fn from(v: InferenceFinishReason) -> Self {
        match v {
            InferenceFinishReason::Stop => PyInferenceFinishReason::Stop,
            InferenceFinishReason::Length => PyInferenceFinishReason::Length,
            InferenceFinishReason::ContentFilter => PyInferenceFinishReason::ContentFilter,
        }
    }
}

#[pyclass(module = "deepring_recipe._native", name = "InferenceChunk", frozen)]
pub(crate) struct PyInferenceChunk {
    inner: InferenceChunk,
}

#[pymethods]
impl PyInferenceChunk {
    #[staticmethod]
    #[pyo3(signature = (*, prompt_usage = None, system_fingerprint = None))]
    fn ready(
        prompt_usage: Option<PyRef<'_, PyPromptUsage>>,
        system_fingerprint: Option<String>,
    ) -> Self {
        PyInferenceChunk {
            inner: InferenceChunk::Ready {
                prompt_usage: prompt_usage.map(|u| u.inner),
                system_fingerprint,
            },
        }
    }
    #[staticmethod]
    #[pyo3(signature = (content, token_count = 0))]
    fn text(content: String, token_count: u64) -> Self {
        PyInferenceChunk {
            inner: InferenceChunk::Text {
                content,
                token_count,
            },
        }
    }
    #[staticmethod]
    #[pyo3(signature = (token_ids, logprobs = None))]
    fn tokens(token_ids: Vec<u32>, logprobs: Option<PyLogprobs>) -> Self {
        let logprobs = logprobs.map(|lps| {
            lps.into_iter()
                .map(|(logprob, top_logprobs)| TokenLogprob {
                    logprob,
                    top_logprobs,
                })
                .collect()
        });
        PyInferenceChunk {
            inner: InferenceChunk::Tokens {
                token_ids,
                logprobs,
            },
        }
    }
    #[staticmethod]
    fn finish(finish_reason: PyInferenceFinishReason) -> Self {
        PyInferenceChunk {
            inner: InferenceChunk::Finish(finish_reason.into()),
        }
    }
    #[getter]
    fn kind(&self) -> &'static str {
        match self.inner {
            InferenceChunk::Ready { .. } => "ready",
            InferenceChunk::Text { .. } => "text",
            InferenceChunk::Tokens { .. } => "tokens",
            InferenceChunk::Finish(_) => "finish",
        }
    }
    #[getter]
    fn content(&self) -> Option<&str> {
        match &self.inner {
            InferenceChunk::Text { content, .. } => Some(content),
            _ => None,
        }
    }
    #[getter]
    fn token_ids(&self) -> Option<Vec<u32>> {
        match &self.inner {
            InferenceChunk::Tokens { token_ids, .. } => Some(token_ids.clone()),
            _ => None,
        }
    }
    #[getter]
    fn finish_reason(&self) -> Option<PyInferenceFinishReason> {
        match self.inner {
            InferenceChunk::Finish(r) => Some(r.into()),
            _ => None,
        }
    }
    #[getter]
    fn prompt_usage(&self) -> Option<PyPromptUsage> {
        match self.inner {
            InferenceChunk::Ready {
                prompt_usage: Some(u),
                ..
            } => Some(PyPromptUsage { inner: u }),
            _ => None,
        }
    }
    #[getter]
    fn token_count(&self) -> Option<u64> {
        match self.inner {
            InferenceChunk::Text { token_count, .. } => Some(token_count),
            _ => None,
        }
    }
    #[getter]
    fn system_fingerprint(&self) -> Option<&str> {
        match &self.inner {
            InferenceChunk::Ready {
                system_fingerprint, ..
            } => system_fingerprint.as_deref(),
            _ => None,
        }
    }
}

/// Take a single-use value out of its slot.
fn take<T>(slot: &mut Option<T>) -> PyResult<T> {
    slot.take().ok_or_else(errors::generator_consumed)
}

#[pyclass(
    module = "deepring_recipe._native",
    name = "ChatCompletionChunkGenerator"
)]
pub(crate) struct PyChatCompletionChunkGenerator {
    inner: Option<ChatCompletionChunkGenerator>,
}

/// `ChatCompletionRequest.chunk_generator(request, id, model)`.
pub(crate) fn chat_chunk_generator(
    request: &ConversationRequest,
    id: String,
    model: String,
) -> PyChatCompletionChunkGenerator {
    PyChatCompletionChunkGenerator {
        inner: Some(ChatCompletionChunkGenerator::for_request(
            request, id, model,
        )),
    }
}

#[pyclass(module = "deepring_recipe._native", name = "ResponsesChunkGenerator")]
pub(crate) struct PyResponsesChunkGenerator {
    inner: Option<ResponsesChunkGenerator>,
}

/// `ResponsesRequest.chunk_generator(request, id, model)`: call it from the request class's
/// static method (the custom tools come from `request.output.custom_tools`).
pub(crate) fn responses_chunk_generator(
    request: &ConversationRequest,
    id: String,
    model: String,
) -> PyResponsesChunkGenerator {
    PyResponsesChunkGenerator {
        inner: Some(ResponsesChunkGenerator::for_request(request, id, model)),
    }
}

#[pymethods]
impl PyResponsesChunkGenerator {
    fn with_namespace_tool_map(
        &mut self,
        namespace_tool_map: HashMap<String, (String, String)>,
    ) -> PyResult<Self> {
        let g = take(&mut self.inner)?;
        Ok(PyResponsesChunkGenerator {
            inner: Some(g.with_namespace_tool_map(namespace_tool_map)),
        })
    }
    fn with_echo(&mut self, echo: PyRef<'_, PyResponsesEcho>) -> PyResult<Self> {
        let g = take(&mut self.inner)?;
        Ok(PyResponsesChunkGenerator {
            inner: Some(g.with_echo(echo.inner.clone())),
        })
    }
}

#[pyclass(module = "deepring_recipe._native", name = "MessagesChunkGenerator")]
pub(crate) struct PyMessagesChunkGenerator {
    inner: Option<MessagesChunkGenerator>,
}

/// `MessagesRequest.chunk_generator(request, id, model)`.
pub(crate) fn messages_chunk_generator(
    request: &ConversationRequest,
    id: String,
    model: String,
) -> PyMessagesChunkGenerator {
    PyMessagesChunkGenerator {
        inner: Some(MessagesChunkGenerator::for_request(request, id, model)),
    }
}

#[pymethods]
impl PyMessagesChunkGenerator {
    #[new]
    fn new(id: String, model: String, thinking_mode: bool) -> Self {
        PyMessagesChunkGenerator {
            inner: Some(MessagesChunkGenerator::new(id, model, thinking_mode)),
        }
    }
    fn with_signature(&mut self, signature: String) -> PyResult<Self> {
        let g = take(&mut self.inner)?;
        Ok(PyMessagesChunkGenerator {
            inner: Some(g.with_signature(signature)),
        })
    }
}

enum Processor {
    Chat(StreamProcessor<ChatCompletionChunkGenerator>),
    Responses(StreamProcessor<ResponsesChunkGenerator>),
    Messages(StreamProcessor<MessagesChunkGenerator>),
}

#[pyclass(module = "deepring_recipe._native", name = "StreamProcessor")]
pub(crate) struct PyStreamProcessor {
    inner: Processor,
}

fn chunk_size(chunk: &InferenceChunk) -> usize {
    match chunk {
        InferenceChunk::Text { content, .. } => content.len(),
        InferenceChunk::Tokens { token_ids, .. } => token_ids.len() * 4,
        _ => 0,
    }
}

fn run<G: ChunkGenerator>(
    py: Python<'_>,
    p: &mut StreamProcessor<G>,
    chunk: Option<&InferenceChunk>,
) -> Result<Vec<G::Event>, StreamError> {
    match chunk {
        Some(c) if chunk_size(c) >= DETACH_BYTES => py.detach(|| p.push(c)),
        Some(c) => p.push(c),
        None => p.finish(),
    }
}

fn events<'py, T, E>(
    py: Python<'py>,
    events: Vec<E>,
    wrap: impl Fn(E) -> T,
) -> PyResult<Bound<'py, PyList>>
where
    T: pyo3::PyClass + Into<pyo3::PyClassInitializer<T>>,
{
    let objects = events
        .into_iter()
        .map(|e| Py::new(py, wrap(e)))
        .collect::<PyResult<Vec<Py<T>>>>()?;
    PyList::new(py, objects)
}

impl PyStreamProcessor {
    fn step<'py>(
        &mut self,
        py: Python<'py>,
        chunk: Option<&InferenceChunk>,
    ) -> PyResult<Bound<'py, PyList>> {
        match &mut self.inner {
            Processor::Chat(p) => {
                let out = run(py, p, chunk).map_err(errors::stream)?;
                events(py, out, |e| PyChatCompletionChunk { inner: Some(e) })
            }
            Processor::Responses(p) => {
                let out = run(py, p, chunk).map_err(errors::stream)?;
                events(py, out, |e| PyResponsesStreamEvent { inner: Some(e) })
            }
            Processor::Messages(p) => {
                let out = run(py, p, chunk).map_err(errors::stream)?;
                events(py, out, |e| PyMessagesStreamEvent { inner: Some(e) })
            }
        }
    }
}

#[pymethods]
impl PyStreamProcessor {
    #[new]
    #[pyo3(signature = (generator, options, tokenizer = None))]
    fn new(
        generator: &Bound<'_, PyAny>,
        options: PyRef<'_, PyParsingOptions>,
        tokenizer: Option<PyRef<'_, PyTokenizer>>,
    ) -> PyResult<Self> {
        let options = &options.inner;
        let tokenizer = tokenizer.map(|t| t.inner.clone());
        let inner = if let Ok(g) = generator.cast::<PyChatCompletionChunkGenerator>() {
            let g = take(&mut g.borrow_mut().inner)?;
            Processor::Chat(StreamProcessor::new(g, options, tokenizer))
        } else if let Ok(g) = generator.cast::<PyResponsesChunkGenerator>() {
            let g = take(&mut g.borrow_mut().inner)?;
            Processor::Responses(StreamProcessor::new(g, options, tokenizer))
        } else if let Ok(g) = generator.cast::<PyMessagesChunkGenerator>() {
            let g = take(&mut g.borrow_mut().inner)?;
            Processor::Messages(StreamProcessor::new(g, options, tokenizer))
        } else {
            return Err(PyTypeError::new_err("expected a protocol chunk generator"));
        };
        Ok(PyStreamProcessor { inner })
    }

    #[getter]
    fn finished(&self) -> bool {
        match &self.inner {
            Processor::Chat(p) => p.finished(),
            Processor::Responses(p) => p.finished(),
            Processor::Messages(p) => p.finished(),
        }
    }

    fn push<'py>(
        &mut self,
        py: Python<'py>,
        chunk: PyRef<'_, PyInferenceChunk>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.step(py, Some(&chunk.inner))
    }

    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.step(py, None)
    }

    fn close(&mut self) {
        match &mut self.inner {
            Processor::Chat(p) => p.close(),
            Processor::Responses(p) => p.close(),
            Processor::Messages(p) => p.close(),
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPromptUsage>()?;
    m.add_class::<PyInferenceFinishReason>()?;
    m.add_class::<PyInferenceChunk>()?;
    m.add_class::<PyChatCompletionChunkGenerator>()?;
    m.add_class::<PyResponsesChunkGenerator>()?;
    m.add_class::<PyMessagesChunkGenerator>()?;
    m.add_class::<PyResponsesEcho>()?;
    m.add_class::<PyStreamProcessor>()?;
    Ok(())
}
