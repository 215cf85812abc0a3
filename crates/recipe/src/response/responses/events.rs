//! Stream events and their JSON.

use std::sync::Arc;

use super::items::{reasoning_part, text_part, ItemBody, OutputItem};
use super::object::ResponseObject;
use crate::response::json;
use crate::stream::TokenLogprobs;

/// The kinds of text an item streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaKind {
    ReasoningText,
    OutputText,
    FunctionCallArguments,
    CustomToolCallInput,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ResponsesEventKind {
    Created(Box<ResponseObject>),
    InProgress(Box<ResponseObject>),
    Completed(Box<ResponseObject>),
    Incomplete(Box<ResponseObject>),
    OutputItemAdded(Box<OutputItem>),
    OutputItemDone(Box<OutputItem>),
    /// `content_part.added` of the item (reasoning_text / output_text part, empty).
    ContentPartAdded(Box<OutputItem>),
    /// `content_part.done` of the item, with its text.
    ContentPartDone(Box<OutputItem>),
    Delta {
        kind: DeltaKind,
        output_index: usize,
        item_id: String,
        delta: String,
        logprobs: Vec<TokenLogprobs>,
    },
    /// `*.done` of the item's text.
    TextDone(Box<OutputItem>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ResponsesStreamEvent {
    pub response_id: Arc<str>,
    pub sequence_number: u64,
    pub kind: ResponsesEventKind,
}

impl ResponsesStreamEvent {
    pub fn event_type(&self) -> &'static str {
        match &self.kind {
            ResponsesEventKind::Created(_) => "response.created",
            ResponsesEventKind::InProgress(_) => "response.in_progress",
            ResponsesEventKind::Completed(_) => "response.completed",
            ResponsesEventKind::Incomplete(_) => "response.incomplete",
            ResponsesEventKind::OutputItemAdded(_) => "response.output_item.added",
            ResponsesEventKind::OutputItemDone(_) => "response.output_item.done",
            ResponsesEventKind::ContentPartAdded(_) => "response.content_part.added",
            ResponsesEventKind::ContentPartDone(_) => "response.content_part.done",
            ResponsesEventKind::Delta { kind, .. } => match kind {
                DeltaKind::ReasoningText => "response.reasoning_text.delta",
                DeltaKind::OutputText => "response.output_text.delta",
                DeltaKind::FunctionCallArguments => "response.function_call_arguments.delta",
                DeltaKind::CustomToolCallInput => "response.custom_tool_call_input.delta",
            },
            ResponsesEventKind::TextDone(item) => match item.body {
                ItemBody::Reasoning { .. } => "response.reasoning_text.done",
                ItemBody::Message { .. } => "response.output_text.done",
                ItemBody::FunctionCall { .. } => "response.function_call_arguments.done",
                ItemBody::CustomToolCall { .. } => "response.custom_tool_call_input.done",
            },
        }
    }

    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(256);
        out.push_str("{\"type\":\"");
        out.push_str(self.event_type());
        out.push('"');
        let rid = &*self.response_id;
        match &self.kind {
            ResponsesEventKind::Created(r)
            | ResponsesEventKind::InProgress(r)
            | ResponsesEventKind::Completed(r)
            | ResponsesEventKind::Incomplete(r) => {
                out.push_str(",\"response\":");
                r.write(&mut out);
            }
            ResponsesEventKind::OutputItemAdded(item)
            | ResponsesEventKind::OutputItemDone(item) => {
                let full = matches!(self.kind, ResponsesEventKind::OutputItemDone(_));
                out.push_str(",\"item\":");
                item.write(&mut out, rid, full);
                out.push_str(",\"output_index\":");
                json::uint(&mut out, item.index as u64);
            }
            ResponsesEventKind::ContentPartAdded(item)
            | ResponsesEventKind::ContentPartDone(item) => {
                let done = matches!(self.kind, ResponsesEventKind::ContentPartDone(_));
                out.push_str(",\"content_index\":0,\"item_id\":");
                item.write_id(&mut out, rid);
                out.push_str(",\"output_index\":");
                json::uint(&mut out, item.index as u64);
                out.push_str(",\"part\":");
                match &item.body {
                    ItemBody::Reasoning { text } => {
                        reasoning_part(&mut out, if done { text } else { "" })
                    }
                    ItemBody::Message { text, logprobs, .. } => {
                        if done {
                            text_part(&mut out, text, logprobs)
                        } else {
                            text_part(&mut out, "", &[])
                        }
                    }
                    _ => out.push_str("null"),
                }
            }
            ResponsesEventKind::Delta {
                kind,
                output_index,
                item_id,
                delta,
                logprobs,
            } => {
                let text = matches!(kind, DeltaKind::ReasoningText | DeltaKind::OutputText);
                if text {
                    out.push_str(",\"content_index\":0");
                }
                out.push_str(",\"delta\":");
                json::string(&mut out, delta);
                out.push_str(",\"item_id\":");
                json::string(&mut out, item_id);
                if *kind == DeltaKind::OutputText {
                    out.push_str(",\"logprobs\":");
                    json::logprobs(&mut out, logprobs);
                }
                out.push_str(",\"output_index\":");
                json::uint(&mut out, *output_index as u64);
            }
            ResponsesEventKind::TextDone(item) => match &item.body {
                ItemBody::Reasoning { text } => {
                    out.push_str(",\"content_index\":0,\"item_id\":");
                    item.write_id(&mut out, rid);
                    out.push_str(",\"output_index\":");
                    json::uint(&mut out, item.index as u64);
                    self.seq(&mut out);
                    out.push_str(",\"text\":");
                    json::string(&mut out, text);
                    out.push('}');
                    return out;
                }
                ItemBody::Message { text, logprobs, .. } => {
                    out.push_str(",\"content_index\":0,\"item_id\":");
                    item.write_id(&mut out, rid);
                    out.push_str(",\"logprobs\":");
                    json::logprobs(&mut out, logprobs);
                    out.push_str(",\"output_index\":");
                    json::uint(&mut out, item.index as u64);
                    self.seq(&mut out);
                    out.push_str(",\"text\":");
                    json::string(&mut out, text);
                    out.push('}');
                    return out;
                }
                ItemBody::FunctionCall { arguments, .. } => {
                    out.push_str(",\"arguments\":");
                    json::string(&mut out, arguments);
                    out.push_str(",\"item_id\":");
                    item.write_id(&mut out, rid);
                    out.push_str(",\"output_index\":");
                    json::uint(&mut out, item.index as u64);
                }
                ItemBody::CustomToolCall { input, .. } => {
                    out.push_str(",\"input\":");
                    json::string(&mut out, input);
                    out.push_str(",\"item_id\":");
                    item.write_id(&mut out, rid);
                    out.push_str(",\"output_index\":");
                    json::uint(&mut out, item.index as u64);
                }
            },
        }
        self.seq(&mut out);
        out.push('}');
        out
    }

    fn seq(&self, out: &mut String) {
        out.push_str(",\"sequence_number\":");
        json::uint(out, self.sequence_number);
    }
}
