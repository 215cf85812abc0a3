//! Protocol events and non-streaming bodies: Chat Completions chunks, Responses events,
//! Messages events, each with `to_json` (byte-compatible with deepseek-recipe 0.2.0: compact,
//! keys in the official order) and the accumulator that turns a stream back into the
//! non-streaming response.

pub mod chat;
pub(crate) mod json;
pub mod messages;
pub mod responses;
pub mod usage;

pub use chat::{ChatCompletionChunk, ChatCompletionResponse, ChatDelta, ChatHead, LogprobField};
pub use messages::{BlockDelta, BlockStart, MessageHead, MessagesResponse, MessagesStreamEvent};
pub use responses::{
    DeltaKind, ItemBody, ItemStatus, OutputItem, ResponseObject, ResponseStatus, ResponsesEcho,
    ResponsesEventKind, ResponsesResponse, ResponsesStreamEvent, ServedSettings,
};
pub use usage::Usage;
