//! Responses `instructions` and `input` items -> conversation messages.

use serde_json::json;

use super::wire::ResponsesRequest;
use super::wire_items::{
    InputItem, ItemContent, ItemRole, ResponsesContentBlock, ResponsesInput,
    ResponsesToolCallOutputItem, ToolOutput,
};
use crate::conversation::{ImageDetail, ImageSource, Message, Role, ToolCall};
use crate::request::chat::{WireDetail, UNSUPPORTED_IMAGE_TEXT};
use crate::request::common::{bad, BlockText, Result};
use crate::request::images;

impl ResponsesRequest {
    pub(super) fn convert_input(&self, image_token: &str, vision: bool) -> Result<Vec<Message>> {
        let mut out: Vec<Message> = Vec::with_capacity(2);
        if let Some(instructions) = self.instructions.as_ref().filter(|s| !s.is_empty()) {
            out.push(
                Message::system(instructions.clone(), Vec::new(), None, image_token)
                    .map_err(|e| bad(e.to_string()))?,
            );
        }
        let items = match &self.input {
            None if self.instructions.is_none() => {
                return Err(bad("Either input or instructions must be provided"))
            }
            None => return Ok(out),
            Some(ResponsesInput::Text(s)) => {
                out.push(
                    Message::user(s.clone(), Vec::new(), image_token)
                        .map_err(|e| bad(e.to_string()))?,
                );
                return Ok(out);
            }
            Some(ResponsesInput::Items(items)) => items,
        };
        if items.is_empty() {
            return Err(bad("Input items array must not be empty"));
        }
        let mut state = InputState {
            out,
            reasoning: None,
            pending: Vec::new(),
            answered: Vec::new(),
            image_token,
            vision,
        };
        for (i, item) in items.iter().enumerate() {
            state.item(i, item)?;
        }
        state.close_calls()?;
        state.flush_reasoning();
        let mut out = state.out;
        order_outputs_by_call(&mut out);
        Ok(out)
    }
}

/// The calls of one assistant message are ordered by call id, and their outputs follow in the
/// same order.
fn order_outputs_by_call(messages: &mut [Message]) {
    let mut i = 0;
    while i < messages.len() {
        if let Some(calls) = messages[i].tool_calls.as_mut() {
            calls.sort_by(|a, b| a.id.cmp(&b.id));
        }
        let Some(ids) = messages[i]
            .tool_calls
            .as_ref()
            .map(|c| c.iter().map(|c| c.id.clone()).collect::<Vec<_>>())
        else {
            i += 1;
            continue;
        };
        let start = i + 1;
        let mut end = start;
        while end < messages.len() && messages[end].role == Role::Tool {
            end += 1;
        }
        messages[start..end].sort_by_key(|m| {
            m.tool_call_id
                .as_deref()
                .and_then(|id| ids.iter().position(|c| c == id))
                .unwrap_or(usize::MAX)
        });
        i = end;
    }
}

/// Walks the input items: groups function calls into one assistant message, attaches reasoning
/// items to the next assistant message, checks that every call gets exactly one output.
struct InputState<'a> {
    out: Vec<Message>,
    /// Reasoning text waiting for the next assistant message.
    reasoning: Option<String>,
    /// Call ids of the current assistant message that have no output yet.
    pending: Vec<String>,
    /// Call ids already answered (for the duplicate check).
    answered: Vec<String>,
    image_token: &'a str,
    vision: bool,
}

impl InputState<'_> {
    fn item(&mut self, i: usize, item: &InputItem) -> Result<()> {
        match item {
            InputItem::Ignored => Ok(()),
            InputItem::Reasoning(r) => {
                let Some(parts) = &r.content else {
                    return Ok(());
                };
                let text: Vec<&str> = parts.iter().map(|p| p.text.as_str()).collect();
                let text = text.join("\n");
                // Empty reasoning text counts as no reasoning passed back.
                if text.is_empty() {
                    return Ok(());
                }
                self.reasoning = Some(match self.reasoning.take() {
                    Some(prev) => format!("{prev}\n{text}"),
                    None => text,
                });
                Ok(())
            }
            InputItem::Message(m) => {
                self.close_calls()?;
                let (text, images) = self.content(i, &m.content, m.role == ItemRole::Assistant)?;
                let (content, spans) = text.finish();
                // V4-Pro takes developer messages as user messages.
                let role = match m.role {
                    ItemRole::Developer if !self.vision => ItemRole::User,
                    role => role,
                };
                let message = match role {
                    ItemRole::User => {
                        self.flush_reasoning();
                        Message::with_placeholders(Role::User, content, images, spans)
                    }
                    ItemRole::System | ItemRole::Developer => {
                        self.flush_reasoning();
                        Message::with_placeholders(Role::System, content, images, spans)
                    }
                    ItemRole::Assistant => {
                        // Consecutive assistant messages (no calls, no reasoning between) are
                        // one turn: their texts join with a blank line, empty ones dropped.
                        if let Some(last) = self.open_assistant() {
                            if !content.is_empty() {
                                if !last.content.is_empty() {
                                    last.content.push_str("\n\n");
                                }
                                last.content.push_str(&content);
                            }
                            return Ok(());
                        }
                        Message::assistant(content, self.reasoning.take(), None, false)
                    }
                };
                self.out.push(message);
                Ok(())
            }
            InputItem::FunctionCall(call) => {
                let sep = if self.vision { "::" } else { "__" };
                let name = match &call.namespace {
                    Some(ns) => format!("{ns}{sep}{}", call.name),
                    None => call.name.clone(),
                };
                self.add_call(ToolCall {
                    id: call.call_id.clone(),
                    name,
                    arguments: call.arguments.clone(),
                });
                Ok(())
            }
            InputItem::CustomToolCall(call) => {
                self.add_call(ToolCall {
                    id: call.call_id.clone(),
                    name: call.name.clone(),
                    arguments: json!({"input": call.input}).to_string(),
                });
                Ok(())
            }
            InputItem::FunctionCallOutput(o) => self.output(i, o.call_id.as_deref(), &o.output),
            InputItem::CustomToolCallOutput(o) => {
                let empty = ToolOutput::Text(String::new());
                self.output(i, Some(&o.call_id), o.output.as_ref().unwrap_or(&empty))
            }
        }
    }

    /// Append a call to the open assistant message (the last message, if it is an assistant
    /// message still taking calls), or open one.
    fn add_call(&mut self, call: ToolCall) {
        let extend = self.pending_open() && self.out.last().is_some_and(|m| m.tool_calls.is_some());
        let joins_assistant = !extend
            && self.reasoning.is_none()
            && self
                .out
                .last()
                .is_some_and(|m| m.role == Role::Assistant && m.tool_calls.is_none());
        self.pending.push(call.id.clone());
        if extend || joins_assistant {
            if let Some(last) = self.out.last_mut() {
                last.tool_calls.get_or_insert_with(Vec::new).push(call);
            }
        } else {
            let reasoning = self.reasoning.take();
            self.out.push(Message::assistant(
                String::new(),
                reasoning,
                Some(vec![call]),
                false,
            ));
        }
    }

    /// The last message, when it is an assistant text turn a following assistant message joins.
    fn open_assistant(&mut self) -> Option<&mut Message> {
        if self.reasoning.is_some() {
            return None;
        }
        self.out
            .last_mut()
            .filter(|m| m.role == Role::Assistant && m.tool_calls.is_none())
    }

    fn pending_open(&self) -> bool {
        !self.pending.is_empty()
    }

    fn output(&mut self, i: usize, call_id: Option<&str>, output: &ToolOutput) -> Result<()> {
        let Some(id) = call_id else {
            // An output that answers no call ends the calls before it, as a message does.
            self.close_calls()?;
            return self.push_output(i, None, output);
        };
        if self.answered.iter().any(|a| a == id) {
            return Err(bad(format!("Duplicate tool output for call_id: {id}.")));
        }
        let Some(pos) = self.pending.iter().position(|p| p == id) else {
            return Err(bad(format!(
                "No tool call found for tool output with call_id {id}."
            )));
        };
        self.pending.remove(pos);
        self.answered.push(id.to_string());
        self.push_output(i, Some(id), output)
    }

    fn push_output(&mut self, i: usize, call_id: Option<&str>, output: &ToolOutput) -> Result<()> {
        let (text, images) = self.output_content(i, output)?;
        let (content, spans) = text.finish();
        let mut message = Message::with_placeholders(Role::Tool, content, images, spans);
        message.tool_call_id = call_id.map(str::to_string);
        self.out.push(message);
        Ok(())
    }

    fn close_calls(&mut self) -> Result<()> {
        if let Some(id) = self.pending.first() {
            // The first unanswered call in call order (the official names a random one:
            // recipe/DEVIATIONS.md R4).
            return Err(bad(format!("No tool output found for tool call {id}.")));
        }
        self.answered.clear();
        Ok(())
    }

    /// Reasoning not followed by an assistant message becomes an empty assistant turn of its own.
    fn flush_reasoning(&mut self) {
        if let Some(r) = self.reasoning.take() {
            self.out
                .push(Message::assistant(String::new(), Some(r), None, false));
        }
    }

    /// The image URL of an `input_image` part; errors at once (with the part's path) when it has
    /// none. An empty URL counts as none and a `file_id` is refused even when empty, as the
    /// official's checks read.
    fn image_url<'u>(
        part_path: &str,
        image_url: &'u Option<String>,
        file_id: &Option<String>,
    ) -> Result<&'u str> {
        match image_url {
            Some(url) if !url.is_empty() => Ok(url),
            _ if file_id.is_some() => Err(bad(format!(
                "{part_path}: file_id is not supported. Pass the image as a base64 data url instead."
            ))),
            _ => Err(bad(format!(
                "{part_path}: input_image must have image_url or file_id"
            ))),
        }
    }

    /// The image an URL names, checked (with the item's path). Runs after all parts of an item
    /// were read: a later part's missing URL or file_id is reported before an earlier URL's
    /// format, as the official does.
    fn image_source(path: &str, url: &str, detail: Option<WireDetail>) -> Result<ImageSource> {
        let detail = detail.map_or(ImageDetail::High, ImageDetail::from);
        let data = images::url_image_data(url).map_err(|m| bad(format!("{path}: {m}")))?;
        Ok(images::source(data, detail, path))
    }

    fn image_sources(
        path: &str,
        urls: Vec<(&str, Option<WireDetail>)>,
    ) -> Result<Vec<ImageSource>> {
        urls.into_iter()
            .map(|(url, detail)| Self::image_source(path, url, detail))
            .collect()
    }

    fn content(
        &self,
        i: usize,
        content: &ItemContent,
        assistant: bool,
    ) -> Result<(BlockText, Vec<ImageSource>)> {
        let mut texts = BlockText::default();
        let parts = match content {
            ItemContent::Text(s) => {
                texts.push_text(s);
                return Ok((texts, Vec::new()));
            }
            ItemContent::Parts(p) => p,
        };
        let path = format!("input[{i}]");
        let mut urls = Vec::new();
        for (j, part) in parts.iter().enumerate() {
            match part {
                ResponsesContentBlock::InputText { text }
                | ResponsesContentBlock::OutputText { text } => texts.push_text(text),
                ResponsesContentBlock::InputFile {} => texts.push_text("[Unsupported Document]"),
                ResponsesContentBlock::InputImage { .. } if !self.vision => {
                    texts.push_text(UNSUPPORTED_IMAGE_TEXT)
                }
                ResponsesContentBlock::InputImage {
                    image_url,
                    file_id,
                    detail,
                } => {
                    let part_path = format!("{path}.content[{j}]");
                    urls.push((Self::image_url(&part_path, image_url, file_id)?, *detail));
                    texts.push_image(self.image_token);
                }
            }
        }
        // After the parts: an assistant's image is refused before any URL is looked at.
        if assistant && !urls.is_empty() {
            return Err(bad(format!(
                "{path}: Image in assistant message is unsupported"
            )));
        }
        Ok((texts, Self::image_sources(&path, urls)?))
    }

    fn output_content(
        &self,
        i: usize,
        output: &ToolOutput,
    ) -> Result<(BlockText, Vec<ImageSource>)> {
        let mut texts = BlockText::default();
        let parts = match output {
            ToolOutput::Text(s) => {
                texts.push_text(s);
                return Ok((texts, Vec::new()));
            }
            ToolOutput::Parts(p) => p,
        };
        let path = format!("input[{i}]");
        let mut urls = Vec::new();
        for (j, part) in parts.iter().enumerate() {
            match part {
                ResponsesToolCallOutputItem::InputText { text } => texts.push_text(text),
                ResponsesToolCallOutputItem::InputFile {} => {
                    texts.push_text("[Unsupported Document]")
                }
                ResponsesToolCallOutputItem::InputImage { .. } if !self.vision => {
                    texts.push_text(UNSUPPORTED_IMAGE_TEXT)
                }
                ResponsesToolCallOutputItem::InputImage {
                    image_url,
                    file_id,
                    detail,
                } => {
                    let part_path = format!("{path}.output[{j}]");
                    urls.push((Self::image_url(&part_path, image_url, file_id)?, *detail));
                    texts.push_image(self.image_token);
                }
            }
        }
        Ok((texts, Self::image_sources(&path, urls)?))
    }
}
