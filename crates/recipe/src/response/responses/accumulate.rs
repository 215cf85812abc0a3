//! The non-streaming body, accumulated from the stream events.

use std::sync::Arc;

use super::echo::ResponsesEcho;
use super::events::{ResponsesEventKind, ResponsesStreamEvent};
use super::items::ItemBody;
use super::object::{ResponseObject, ResponseStatus};

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
