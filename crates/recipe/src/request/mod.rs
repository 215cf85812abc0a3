//! Protocol requests -> [`ConversationRequest`]: the conversation plus inference and parsing options.
//!
//! Each protocol module deserialises the wire format with serde types that mirror deepseek-recipe
//! 0.2.0 (same field names, types and variant lists, so malformed bodies get the same messages),
//! then converts in the official order of checks; [`common`] holds the steps they share.

mod body;
pub mod chat;
mod common;
mod fields;
mod images;
pub mod messages;
mod options;
pub mod responses;
pub mod schema;

pub use body::{parse_body, parse_body_boxed, RequestBody};
pub use fields::{outline, outline_value, pick_fields, Outline};
pub use options::{
    ConversionOptions, InferenceOptions, OutputConstraint, ParsingOptions,
    ReasoningContentBehavior, ThinkingInitialStage, WebSearchBehavior,
};

use std::sync::Arc;

use crate::conversation::{Conversation, ReasoningEffort};
use crate::error::ConversionError;
use crate::render::ModelVersion;

/// A converted request: what to render, how to sample, how to parse the output.
#[derive(Clone, Debug, PartialEq)]
pub struct ConversationRequest {
    /// Shared: the Python binding hands it out without copying the messages.
    pub conversation: Arc<Conversation>,
    pub inference_options: InferenceOptions,
    pub parsing_options: ParsingOptions,
    pub model_version: ModelVersion,
    pub stream: bool,
    /// What the chunk generators need from the request besides the conversation.
    pub output: OutputOptions,
}

/// Request facts that shape the streamed events rather than the prompt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputOptions {
    /// Chat Completions `stream_options.include_usage`: streamed chunks without usage then say
    /// `"usage":null` (they omit it when streaming without it).
    pub include_usage: bool,
    /// Responses custom tools (`apply_patch`) that conversion declared as function tools: their
    /// calls become `custom_tool_call` items.
    pub custom_tools: Vec<String>,
}

impl ConversationRequest {
    /// A request with default inference, parsing and transport options.
    pub fn new(conversation: Conversation, model_version: ModelVersion) -> Self {
        ConversationRequest {
            conversation: Arc::new(conversation),
            inference_options: InferenceOptions::default(),
            parsing_options: ParsingOptions::default(),
            model_version,
            stream: false,
            output: OutputOptions::default(),
        }
    }

    /// The `max_tokens` to send to the backend for a prompt of `prompt_tokens` in a context of
    /// `context_limit` tokens.
    pub fn resolve_max_tokens(
        &self,
        prompt_tokens: u64,
        context_limit: u64,
    ) -> Result<u64, ConversionError> {
        let requested = self.inference_options.max_tokens.map(u64::from);
        let conv = &self.conversation;
        let default = if !conv.thinking_mode {
            8192
        } else if conv.reasoning_effort == Some(ReasoningEffort::Max) {
            131_072
        } else {
            65_536
        };
        let over = match requested {
            Some(m) => prompt_tokens.saturating_add(m) > context_limit,
            None => prompt_tokens > context_limit,
        };
        if over {
            let m = requested.unwrap_or(0);
            return Err(ConversionError::bad_request(format!(
                "This model's maximum context length is {context_limit} tokens. However, you requested {} tokens ({prompt_tokens} in the messages, {m} in the completion). Please reduce the length of the messages or completion.",
                prompt_tokens.saturating_add(m)
            )));
        }
        let wanted = requested.unwrap_or(default);
        Ok(wanted
            .min(context_limit.saturating_sub(prompt_tokens))
            .max(1))
    }
}
