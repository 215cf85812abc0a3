//! OpenAI Responses: the response object, its output items, stream events, and accumulation.

use std::sync::Arc;

use serde_json::Value;

use super::json;
use super::usage::Usage;
use crate::stream::TokenLogprobs;

/// The request settings a response object reports ("echo").
///
/// `ResponsesRequest.echo()` builds it from the request body: the scalars as the request gave
/// them (temperature and `top_p` are f32 on the wire, so the object prints `0.3`), and the
/// reasoning, text, tool choice and tool settings already in their response-object JSON form
/// (`{"effort":…,"summary":…}`, `{"format":…,"verbosity":…}`, the `tool_choice` value, the list
/// of declared tools).
#[derive(Clone, Debug, PartialEq)]
pub struct ResponsesEcho {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub temperature: f32,
    pub top_p: f32,
    pub top_logprobs: u64,
    pub user: Option<String>,
    pub reasoning: Value,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Value,
}

impl Default for ResponsesEcho {
    /// The settings of an unspecified request.
    fn default() -> Self {
        ResponsesEcho {
            instructions: None,
            max_output_tokens: None,
            temperature: 1.0,
            top_p: 1.0,
            top_logprobs: 0,
            user: None,
            reasoning: serde_json::json!({"effort": null, "summary": null}),
            text: serde_json::json!({"format": {"type": "text"}, "verbosity": null}),
            tool_choice: Value::String("auto".into()),
            tools: Value::Array(Vec::new()),
        }
    }
}

impl ResponsesEcho {
    /// All settings at once (the Rust-side constructor for `ResponsesRequest.echo()`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        instructions: Option<String>,
        max_output_tokens: Option<u64>,
        temperature: Option<f32>,
        top_p: Option<f32>,
        top_logprobs: Option<u64>,
        user: Option<String>,
        reasoning: Value,
        text: Value,
        tool_choice: Value,
        tools: Value,
    ) -> Self {
        ResponsesEcho {
            instructions,
            max_output_tokens,
            temperature: temperature.unwrap_or(1.0),
            top_p: top_p.unwrap_or(1.0),
            top_logprobs: top_logprobs.unwrap_or(0),
            user,
            reasoning,
            text,
            tool_choice,
            tools,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemStatus {
    InProgress,
    Completed,
    Incomplete,
}

impl ItemStatus {
    fn as_str(self) -> &'static str {
        match self {
            ItemStatus::InProgress => "in_progress",
            ItemStatus::Completed => "completed",
            ItemStatus::Incomplete => "incomplete",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ItemBody {
    Reasoning {
        text: String,
    },
    Message {
        text: String,
        logprobs: Vec<TokenLogprobs>,
        /// `final_answer`, or `commentary` once a tool call followed it.
        commentary: bool,
    },
    FunctionCall {
        call_id: String,
        name: String,
        namespace: Option<String>,
        arguments: String,
    },
    CustomToolCall {
        call_id: String,
        name: String,
        input: String,
    },
}

/// One output item. `added` items are written with empty content (as `output_item.added` shows
/// them).
#[derive(Clone, Debug, PartialEq)]
pub struct OutputItem {
    pub index: usize,
    pub status: ItemStatus,
    pub body: ItemBody,
}

impl OutputItem {
    fn write_id(&self, out: &mut String, response_id: &str) {
        json::string(out, &self.item_id(response_id));
    }

    /// `<kind prefix><response id>_<index>`.
    pub fn item_id(&self, response_id: &str) -> String {
        let prefix = match self.body {
            ItemBody::Reasoning { .. } => "rs_",
            ItemBody::Message { .. } => "msg_",
            ItemBody::FunctionCall { .. } => "fc_",
            ItemBody::CustomToolCall { .. } => "ctc_",
        };
        let mut id = String::with_capacity(prefix.len() + response_id.len() + 4);
        id.push_str(prefix);
        id.push_str(response_id);
        id.push('_');
        id.push_str(&self.index.to_string());
        id
    }

    /// `full`: with content (false for `output_item.added`).
    pub fn write(&self, out: &mut String, response_id: &str, full: bool) {
        let status = self.status.as_str();
        match &self.body {
            ItemBody::Reasoning { text } => {
                out.push_str("{\"type\":\"reasoning\",\"id\":");
                self.write_id(out, response_id);
                out.push_str(",\"status\":\"");
                out.push_str(status);
                out.push_str("\",\"content\":[");
                if full {
                    reasoning_part(out, text);
                }
                out.push_str("],\"summary\":[],\"encrypted_content\":");
                json::string(out, &format!("{response_id}-{}", self.index));
                out.push('}');
            }
            ItemBody::Message {
                text,
                logprobs,
                commentary,
            } => {
                out.push_str("{\"type\":\"message\",\"id\":");
                self.write_id(out, response_id);
                out.push_str(",\"status\":\"");
                out.push_str(status);
                out.push_str("\",\"role\":\"assistant\",\"phase\":");
                out.push_str(if *commentary {
                    "\"commentary\""
                } else {
                    "\"final_answer\""
                });
                out.push_str(",\"content\":[");
                if full {
                    text_part(out, text, logprobs);
                }
                out.push_str("]}");
            }
            ItemBody::FunctionCall {
                call_id,
                name,
                namespace,
                arguments,
            } => {
                out.push_str("{\"type\":\"function_call\",\"id\":");
                self.write_id(out, response_id);
                out.push_str(",\"status\":\"");
                out.push_str(status);
                out.push_str("\",\"call_id\":");
                json::string(out, call_id);
                out.push_str(",\"name\":");
                json::string(out, name);
                if let Some(ns) = namespace {
                    out.push_str(",\"namespace\":");
                    json::string(out, ns);
                }
                out.push_str(",\"arguments\":");
                json::string(out, if full { arguments } else { "" });
                out.push('}');
            }
            ItemBody::CustomToolCall {
                call_id,
                name,
                input,
            } => {
                out.push_str("{\"type\":\"custom_tool_call\",\"id\":");
                self.write_id(out, response_id);
                out.push_str(",\"status\":\"");
                out.push_str(status);
                out.push_str("\",\"call_id\":");
                json::string(out, call_id);
                out.push_str(",\"name\":");
                json::string(out, name);
                out.push_str(",\"input\":");
                json::string(out, if full { input } else { "" });
                out.push('}');
            }
        }
    }
}

fn reasoning_part(out: &mut String, text: &str) {
    out.push_str("{\"type\":\"reasoning_text\",\"text\":");
    json::string(out, text);
    out.push('}');
}

fn text_part(out: &mut String, text: &str, logprobs: &[TokenLogprobs]) {
    out.push_str("{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":");
    json::logprobs(out, logprobs);
    out.push_str(",\"text\":");
    json::string(out, text);
    out.push('}');
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseStatus {
    InProgress,
    Completed,
    Incomplete,
}

/// The response object of created / in_progress / completed / incomplete events and of the
/// non-streaming body.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponseObject {
    pub id: String,
    pub model: String,
    pub created_at: u64,
    pub status: ResponseStatus,
    pub completed_at: Option<u64>,
    /// `max_output_tokens` or `content_filter` for an incomplete response.
    pub incomplete_reason: Option<&'static str>,
    pub echo: Arc<ResponsesEcho>,
    pub output: Vec<OutputItem>,
    pub usage: Option<Usage>,
}

impl ResponseObject {
    pub fn write(&self, out: &mut String) {
        let e = &*self.echo;
        out.push_str("{\"id\":");
        json::string(out, &self.id);
        out.push_str(",\"object\":\"response\",\"created_at\":");
        json::uint(out, self.created_at);
        out.push_str(",\"status\":");
        out.push_str(match self.status {
            ResponseStatus::InProgress => "\"in_progress\"",
            ResponseStatus::Completed => "\"completed\"",
            ResponseStatus::Incomplete => "\"incomplete\"",
        });
        out.push_str(",\"background\":false,\"completed_at\":");
        json::opt_uint(out, self.completed_at);
        out.push_str(
            ",\"content_filters\":null,\"error\":null,\"frequency_penalty\":0.0,\"incomplete_details\":",
        );
        match self.incomplete_reason {
            Some(r) => {
                out.push_str("{\"reason\":");
                json::string(out, r);
                out.push('}');
            }
            None => out.push_str("null"),
        }
        out.push_str(",\"instructions\":");
        json::opt_string(out, e.instructions.as_deref());
        out.push_str(",\"max_output_tokens\":");
        json::opt_uint(out, e.max_output_tokens);
        out.push_str(",\"max_tool_calls\":null,\"model\":");
        json::string(out, &self.model);
        out.push_str(",\"moderation\":null,\"output\":[");
        for (i, item) in self.output.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            item.write(out, &self.id, true);
        }
        out.push_str(
            "],\"parallel_tool_calls\":true,\"presence_penalty\":0.0,\"previous_response_id\":null,\
             \"prompt_cache_key\":null,\"prompt_cache_retention\":null,\"reasoning\":",
        );
        json::value(out, &e.reasoning);
        out.push_str(
            ",\"safety_identifier\":null,\"service_tier\":\"default\",\"store\":false,\"temperature\":",
        );
        float32(out, e.temperature);
        out.push_str(",\"text\":");
        json::value(out, &e.text);
        out.push_str(",\"tool_choice\":");
        json::value(out, &e.tool_choice);
        out.push_str(",\"tools\":");
        json::value(out, &e.tools);
        out.push_str(",\"top_logprobs\":");
        json::uint(out, e.top_logprobs);
        out.push_str(",\"top_p\":");
        float32(out, e.top_p);
        out.push_str(",\"truncation\":\"disabled\",\"usage\":");
        match &self.usage {
            Some(u) => u.responses_json(out),
            None => out.push_str("null"),
        }
        out.push_str(",\"user\":");
        json::opt_string(out, e.user.as_deref());
        out.push_str(",\"metadata\":{}}");
    }
}

fn float32(out: &mut String, v: f32) {
    match serde_json::to_string(&v) {
        Ok(s) => out.push_str(&s),
        Err(_) => out.push_str("null"),
    }
}

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

/// The non-streaming body: the response object, kept up to date by every event.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponsesResponse {
    object: ResponseObject,
}

impl ResponsesResponse {
    pub fn new(id: String, model: String, created: u64) -> Self {
        ResponsesResponse {
            object: ResponseObject {
                id,
                model,
                created_at: created,
                status: ResponseStatus::InProgress,
                completed_at: None,
                incomplete_reason: None,
                echo: Arc::new(ResponsesEcho::default()),
                output: Vec::new(),
                usage: None,
            },
        }
    }

    pub fn accumulate(&mut self, event: &ResponsesStreamEvent) {
        let output = &mut self.object.output;
        match &event.kind {
            ResponsesEventKind::Created(r)
            | ResponsesEventKind::InProgress(r)
            | ResponsesEventKind::Completed(r)
            | ResponsesEventKind::Incomplete(r) => {
                let keep = matches!(
                    event.kind,
                    ResponsesEventKind::Created(_) | ResponsesEventKind::InProgress(_)
                ) && r.output.is_empty();
                let items = std::mem::take(output);
                self.object = (**r).clone();
                if keep {
                    self.object.output = items;
                }
            }
            ResponsesEventKind::OutputItemAdded(item) => {
                let mut item = (**item).clone();
                clear_text(&mut item.body);
                match output.iter_mut().find(|i| i.index == item.index) {
                    Some(slot) => *slot = item,
                    None => output.push(item),
                }
            }
            ResponsesEventKind::OutputItemDone(item)
            | ResponsesEventKind::TextDone(item)
            | ResponsesEventKind::ContentPartDone(item) => {
                let done = matches!(event.kind, ResponsesEventKind::OutputItemDone(_));
                match output.iter_mut().find(|i| i.index == item.index) {
                    Some(slot) if done => *slot = (**item).clone(),
                    Some(slot) => slot.body = item.body.clone(),
                    None if done => output.push((**item).clone()),
                    None => {}
                }
            }
            ResponsesEventKind::ContentPartAdded(_) => {}
            ResponsesEventKind::Delta {
                output_index,
                delta,
                logprobs,
                ..
            } => {
                if let Some(slot) = output.iter_mut().find(|i| i.index == *output_index) {
                    match &mut slot.body {
                        ItemBody::Reasoning { text } => text.push_str(delta),
                        ItemBody::Message {
                            text, logprobs: l, ..
                        } => {
                            text.push_str(delta);
                            l.extend(logprobs.iter().cloned());
                        }
                        ItemBody::FunctionCall { arguments, .. } => arguments.push_str(delta),
                        ItemBody::CustomToolCall { input, .. } => input.push_str(delta),
                    }
                }
            }
        }
    }

    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(1024);
        self.object.write(&mut out);
        out
    }
}

fn clear_text(body: &mut ItemBody) {
    match body {
        ItemBody::Reasoning { text } => text.clear(),
        ItemBody::Message { text, logprobs, .. } => {
            text.clear();
            logprobs.clear();
        }
        ItemBody::FunctionCall { arguments, .. } => arguments.clear(),
        ItemBody::CustomToolCall { input, .. } => input.clear(),
    }
}
