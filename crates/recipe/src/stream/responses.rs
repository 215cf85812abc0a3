//! Responses event generator.
//!
//! Output items open and close in output order: a reasoning item, a message item, then one item
//! per tool call. An item is closed (its `*.done`, `content_part.done`, `output_item.done`) when
//! the next one opens or at the end. A message closed because a tool call follows changes its
//! phase from `final_answer` to `commentary`. At a length or content-filter end, the open item is
//! `incomplete` and the response ends with `response.incomplete`.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::generator::{render_args, ChunkGenerator, Ending, StartInfo};
use super::ids;
use super::parser::Arg;
use super::TokenLogprobs;
use crate::request::ConversationRequest;
use crate::response::{
    DeltaKind, ItemBody, ItemStatus, OutputItem, ResponseObject, ResponseStatus, ResponsesEcho,
    ResponsesEventKind, ResponsesStreamEvent, Usage,
};

/// A custom tool's `input`: when the call's first parameter is a string named `input`, the input
/// is that string, streamed unescaped (later parameters are ignored); otherwise it is the whole
/// argument JSON. The argument prefix is held until that is decided.
#[derive(Clone, Debug)]
enum CustomInput {
    Deciding {
        held: String,
        key: String,
        key_done: bool,
    },
    Raw,
    RawDone,
    Json,
}

#[derive(Clone, Debug)]
pub struct ResponsesChunkGenerator {
    id: Arc<str>,
    model: String,
    thinking: bool,
    echo: Arc<ResponsesEcho>,
    namespaces: HashMap<String, (String, String)>,
    custom_tools: Vec<String>,
    created_at: u64,
    sequence: u64,
    output: Vec<OutputItem>,
    /// The id of each output item (computed once; every delta carries it).
    item_ids: Vec<String>,
    /// The item being streamed (an index into `output`).
    open: Option<usize>,
    custom: CustomInput,
    calls: usize,
    reasoning_seen: bool,
}

impl ResponsesChunkGenerator {
    pub fn new(id: String, model: String, thinking: bool) -> Self {
        ResponsesChunkGenerator {
            id: Arc::from(id),
            model,
            thinking,
            echo: Arc::new(ResponsesEcho::default()),
            namespaces: HashMap::new(),
            custom_tools: Vec::new(),
            created_at: ids::unix_now(),
            sequence: 0,
            output: Vec::new(),
            item_ids: Vec::new(),
            open: None,
            custom: CustomInput::Json,
            calls: 0,
            reasoning_seen: false,
        }
    }

    /// The generator for a converted Responses request. Without `with_echo`, the response object
    /// reports default settings and the conversation's tools as function tools.
    pub fn for_request(request: &ConversationRequest, id: String, model: String) -> Self {
        let mut g = Self::new(id, model, request.conversation.thinking_mode);
        g.custom_tools = request.output.custom_tools.clone();
        let tools: Vec<Value> = request
            .conversation
            .tools
            .iter()
            .map(|t| {
                serde_json::json!({
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": t.strict,
                })
            })
            .collect();
        let echo = ResponsesEcho {
            tools: Value::Array(tools),
            ..ResponsesEcho::default()
        };
        g.echo = Arc::new(echo);
        g
    }

    /// Function names of namespace tools -> (namespace, local name).
    pub fn with_namespace_tool_map(mut self, map: HashMap<String, (String, String)>) -> Self {
        self.namespaces = map;
        self
    }

    pub fn with_echo(mut self, echo: ResponsesEcho) -> Self {
        self.echo = Arc::new(echo);
        self
    }

    pub fn with_custom_tools(mut self, names: Vec<String>) -> Self {
        self.custom_tools = names;
        self
    }

    fn event(&mut self, kind: ResponsesEventKind) -> ResponsesStreamEvent {
        let e = ResponsesStreamEvent {
            response_id: Arc::clone(&self.id),
            sequence_number: self.sequence,
            kind,
        };
        self.sequence += 1;
        e
    }

    fn object(&self, status: ResponseStatus, usage: Option<Usage>) -> ResponseObject {
        let done = status != ResponseStatus::InProgress;
        ResponseObject {
            id: self.id.to_string(),
            model: self.model.clone(),
            created_at: self.created_at,
            status,
            completed_at: if done { Some(ids::unix_now()) } else { None },
            incomplete_reason: None,
            echo: Arc::clone(&self.echo),
            output: if done {
                self.output.clone()
            } else {
                Vec::new()
            },
            usage,
        }
    }

    fn item_id(&self, index: usize) -> String {
        self.item_ids[index].clone()
    }

    /// Close the open item (`commentary`: a tool call follows a message).
    fn close(&mut self, status: ItemStatus, commentary: bool, out: &mut Vec<ResponsesStreamEvent>) {
        let Some(index) = self.open.take() else {
            return;
        };
        if let CustomInput::Deciding { held, .. } =
            std::mem::replace(&mut self.custom, CustomInput::Json)
        {
            self.custom_delta(index, held, out);
        }
        let item = &mut self.output[index];
        item.status = status;
        if let ItemBody::Message { commentary: c, .. } = &mut item.body {
            *c = commentary;
        }
        let item = Box::new(item.clone());
        let text = matches!(
            item.body,
            ItemBody::Reasoning { .. } | ItemBody::Message { .. }
        );
        out.push(self.event(ResponsesEventKind::TextDone(item.clone())));
        if text {
            out.push(self.event(ResponsesEventKind::ContentPartDone(item.clone())));
        }
        out.push(self.event(ResponsesEventKind::OutputItemDone(item)));
    }

    fn open_item(&mut self, body: ItemBody, out: &mut Vec<ResponsesStreamEvent>) -> usize {
        let index = self.output.len();
        let item = OutputItem {
            index,
            status: ItemStatus::InProgress,
            body,
        };
        let text = matches!(
            item.body,
            ItemBody::Reasoning { .. } | ItemBody::Message { .. }
        );
        self.item_ids.push(item.item_id(&self.id));
        self.output.push(item.clone());
        self.open = Some(index);
        let item = Box::new(item);
        out.push(self.event(ResponsesEventKind::OutputItemAdded(item.clone())));
        if text {
            out.push(self.event(ResponsesEventKind::ContentPartAdded(item)));
        }
        index
    }

    fn delta(
        &mut self,
        index: usize,
        kind: DeltaKind,
        delta: String,
        logprobs: Vec<TokenLogprobs>,
        out: &mut Vec<ResponsesStreamEvent>,
    ) {
        if delta.is_empty() {
            return;
        }
        let item_id = self.item_id(index);
        out.push(self.event(ResponsesEventKind::Delta {
            kind,
            output_index: index,
            item_id,
            delta,
            logprobs,
        }));
    }

    fn custom_delta(&mut self, index: usize, text: String, out: &mut Vec<ResponsesStreamEvent>) {
        if let ItemBody::CustomToolCall { input, .. } = &mut self.output[index].body {
            input.push_str(&text);
        }
        self.delta(index, DeltaKind::CustomToolCallInput, text, Vec::new(), out);
    }

    fn custom_args(&mut self, index: usize, args: &[Arg], out: &mut Vec<ResponsesStreamEvent>) {
        let mut emit = String::new();
        for (k, a) in args.iter().enumerate() {
            match &mut self.custom {
                CustomInput::Raw => match a {
                    Arg::Str(s) => emit.push_str(s),
                    Arg::StringClose => self.custom = CustomInput::RawDone,
                    _ => {}
                },
                CustomInput::RawDone => {}
                CustomInput::Json => {
                    render_args(&args[k..], &mut emit);
                    break;
                }
                CustomInput::Deciding {
                    held,
                    key,
                    key_done,
                } => match a {
                    Arg::Open { first: true } if held.is_empty() => held.push('{'),
                    Arg::Key(s) if !*key_done => {
                        key.push_str(s);
                        held.push_str(s);
                    }
                    Arg::KeyEnd if !*key_done => {
                        *key_done = true;
                        held.push_str(": ");
                        if key != "\"input\"" {
                            emit.push_str(held);
                            self.custom = CustomInput::Json;
                        }
                    }
                    Arg::StringOpen if *key_done => self.custom = CustomInput::Raw,
                    _ => {
                        emit.push_str(held);
                        render_args(std::slice::from_ref(a), &mut emit);
                        self.custom = CustomInput::Json;
                    }
                },
            }
        }
        if !emit.is_empty() {
            self.custom_delta(index, emit, out);
        }
    }
}

impl ChunkGenerator for ResponsesChunkGenerator {
    type Event = ResponsesStreamEvent;

    fn start(&mut self, _info: &StartInfo, out: &mut Vec<ResponsesStreamEvent>) {
        let created = self.object(ResponseStatus::InProgress, None);
        out.push(self.event(ResponsesEventKind::Created(Box::new(created.clone()))));
        out.push(self.event(ResponsesEventKind::InProgress(Box::new(created))));
    }

    fn reasoning(
        &mut self,
        text: String,
        _logprobs: Option<Vec<TokenLogprobs>>,
        out: &mut Vec<ResponsesStreamEvent>,
    ) {
        self.reasoning_seen |= !text.is_empty();
        let index = match self.open {
            Some(i) if matches!(self.output[i].body, ItemBody::Reasoning { .. }) => i,
            _ => {
                self.close(ItemStatus::Completed, false, out);
                self.open_item(
                    ItemBody::Reasoning {
                        text: String::new(),
                    },
                    out,
                )
            }
        };
        if let ItemBody::Reasoning { text: t } = &mut self.output[index].body {
            t.push_str(&text);
        }
        self.delta(index, DeltaKind::ReasoningText, text, Vec::new(), out);
    }

    fn content(
        &mut self,
        text: String,
        logprobs: Option<Vec<TokenLogprobs>>,
        out: &mut Vec<ResponsesStreamEvent>,
    ) {
        let index = match self.open {
            Some(i) if matches!(self.output[i].body, ItemBody::Message { .. }) => i,
            _ => {
                self.close(ItemStatus::Completed, false, out);
                let body = ItemBody::Message {
                    text: String::new(),
                    logprobs: Vec::new(),
                    commentary: false,
                };
                self.open_item(body, out)
            }
        };
        let logprobs = logprobs.unwrap_or_default();
        if let ItemBody::Message {
            text: t,
            logprobs: l,
            ..
        } = &mut self.output[index].body
        {
            t.push_str(&text);
            l.extend(logprobs.iter().cloned());
        }
        self.delta(index, DeltaKind::OutputText, text, logprobs, out);
    }

    fn tool_start(&mut self, name: String, out: &mut Vec<ResponsesStreamEvent>) {
        self.close(ItemStatus::Completed, true, out);
        let call_id = ids::call_id(self.calls, self.thinking && !self.reasoning_seen);
        self.calls += 1;
        let body = if self.custom_tools.contains(&name) {
            self.custom = CustomInput::Deciding {
                held: String::new(),
                key: String::new(),
                key_done: false,
            };
            ItemBody::CustomToolCall {
                call_id,
                name,
                input: String::new(),
            }
        } else {
            self.custom = CustomInput::Json;
            let (name, namespace) = match self.namespaces.get(&name) {
                Some((ns, local)) => (local.clone(), Some(ns.clone())),
                None => (name, None),
            };
            ItemBody::FunctionCall {
                call_id,
                name,
                namespace,
                arguments: String::new(),
            }
        };
        self.open_item(body, out);
    }

    fn tool_args(&mut self, args: &[Arg], out: &mut Vec<ResponsesStreamEvent>) {
        let Some(index) = self.open else {
            return;
        };
        match self.output[index].body {
            ItemBody::CustomToolCall { .. } => self.custom_args(index, args, out),
            ItemBody::FunctionCall { .. } => {
                let mut text = String::new();
                render_args(args, &mut text);
                if let ItemBody::FunctionCall { arguments, .. } = &mut self.output[index].body {
                    arguments.push_str(&text);
                }
                self.delta(
                    index,
                    DeltaKind::FunctionCallArguments,
                    text,
                    Vec::new(),
                    out,
                );
            }
            _ => {}
        }
    }

    fn finish(&mut self, ending: Ending<'_>, usage: Usage, out: &mut Vec<ResponsesStreamEvent>) {
        let incomplete = match ending {
            Ending::Length => Some("max_output_tokens"),
            Ending::ContentFilter => Some("content_filter"),
            Ending::Stop | Ending::StopSequence(_) => None,
        };
        let status = if incomplete.is_some() {
            ItemStatus::Incomplete
        } else {
            ItemStatus::Completed
        };
        self.close(status, false, out);
        let (status, wrap): (_, fn(Box<ResponseObject>) -> ResponsesEventKind) = match incomplete {
            Some(_) => (ResponseStatus::Incomplete, ResponsesEventKind::Incomplete),
            None => (ResponseStatus::Completed, ResponsesEventKind::Completed),
        };
        let mut object = self.object(status, Some(usage));
        object.incomplete_reason = incomplete;
        out.push(self.event(wrap(Box::new(object))));
    }
}
