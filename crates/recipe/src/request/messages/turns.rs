//! Messages -> conversation messages: the walk that keeps the `tool_use` ids of the last
//! assistant message until `tool_result` blocks answer them, and reports a problem at the first
//! block that shows it, with the official's paths (`messages.2.content.0`).

use super::wire::{
    MessageRole, MessagesContentBlock, MessagesDocumentSource, MessagesImageSource,
    MessagesMessage, MessagesToolReference, MessagesToolResultBlock, TextOrList, ToolResultBlock,
};
use crate::conversation::{ImageData, ImageDetail, ImageSource, Message, Role, ToolCall};
use crate::error::ConversionError;
use crate::pyjson::{self, NumberStyle};
use crate::render::ModelVersion;
use crate::request::chat::UNSUPPORTED_IMAGE_TEXT;
use crate::request::common::{self, bad, Result};
use crate::request::images;

const PENDING_TAIL: &str =
    "Each `tool_use` block must have a corresponding `tool_result` block in the next message.";

/// The ids are listed sorted, as the official keeps them in an ordered set.
pub(super) fn unanswered(path: &str, sep: &str, ids: &[String]) -> ConversionError {
    let mut ids = ids.to_vec();
    ids.sort();
    ids.dedup();
    bad(format!(
        "{path}:{sep}`tool_use` ids were found without `tool_result` blocks immediately after: {}. {PENDING_TAIL}",
        ids.join(", ")
    ))
}

/// Where conversion is while it walks the messages.
pub(super) struct Walk<'a> {
    pub(super) version: ModelVersion,
    pub(super) image_token: &'a str,
    pub(super) out: Vec<Message>,
    /// `tool_use` ids of the last assistant message not answered yet, and its index.
    pub(super) pending: Vec<String>,
    pub(super) pending_at: usize,
    /// Tool names each system message adds, by output message index.
    pub(super) additions: Vec<(usize, Vec<String>)>,
    /// Names of the declared tools.
    pub(super) declared: Vec<String>,
}

impl Walk<'_> {
    pub(super) fn message(&mut self, i: usize, message: &MessagesMessage) -> Result<()> {
        let owned;
        let blocks: &[MessagesContentBlock] = match message.content() {
            // The common case: a user turn as plain text, one message without a block copy.
            TextOrList::Text(s) if message.role() == MessageRole::User => {
                self.check_answered(i)?;
                self.out.push(plain(Role::User, s.clone()));
                return Ok(());
            }
            TextOrList::Text(s) => {
                owned = [MessagesContentBlock::Text { text: s.clone() }];
                &owned
            }
            TextOrList::List(blocks)
                if blocks.is_empty() && message.role() != MessageRole::System =>
            {
                return Err(bad(format!(
                    "messages.{i}: all messages must have non-empty content"
                )));
            }
            TextOrList::List(blocks) => blocks,
        };
        match message.role() {
            MessageRole::User => self.user(i, blocks),
            MessageRole::Assistant => self.assistant(i, blocks),
            MessageRole::System => self.system(i, blocks),
        }
    }

    fn check_answered(&self, i: usize) -> Result<()> {
        if self.pending.is_empty() {
            Ok(())
        } else {
            Err(unanswered(&format!("messages.{i}"), " ", &self.pending))
        }
    }

    fn user(&mut self, i: usize, blocks: &[MessagesContentBlock]) -> Result<()> {
        let mut answered: Vec<&str> = Vec::new();
        for (j, block) in blocks.iter().enumerate() {
            if let MessagesContentBlock::ToolResult {
                tool_use_id,
                content,
                ..
            } = block
            {
                if answered.contains(&tool_use_id.as_str()) {
                    return Err(bad(format!(
                        "messages.{i}.content.{j}: each tool_use must have a single result. Found multiple `tool_result` blocks with id: {tool_use_id}"
                    )));
                }
                let Some(pos) = self.pending.iter().position(|p| p == tool_use_id) else {
                    return Err(bad(format!(
                        "unexpected `messages.{i}.content.{j}: tool_use_id` found in `tool_result` blocks: {tool_use_id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                    )));
                };
                self.pending.remove(pos);
                answered.push(tool_use_id);
                let (message, references) =
                    self.tool_result(i, j, tool_use_id, content.as_ref())?;
                self.out.push(message);
                if !references.is_empty() && self.version == ModelVersion::DeepseekV41Flash {
                    self.additions.push((self.out.len(), references));
                    self.out.push(plain(Role::System, String::new()));
                }
                continue;
            }
            self.check_answered(i)?;
            let message = match block {
                MessagesContentBlock::Text { text } => plain(Role::User, text.clone()),
                MessagesContentBlock::Image { source } => {
                    let path = format!("messages.{i}.content[{j}]");
                    let (text, images) = self.image(source, &path, &path)?;
                    let span = vec![(0, text.len())];
                    if images.is_empty() {
                        plain(Role::User, text)
                    } else {
                        Message::with_placeholders(Role::User, text, images, span)
                    }
                }
                MessagesContentBlock::Document { source } => plain(Role::User, document(source)),
                MessagesContentBlock::Thinking { .. } => return Err(thinking_outside_assistant(i)),
                MessagesContentBlock::ToolUse { .. }
                | MessagesContentBlock::ServerToolUse { .. } => {
                    return Err(tool_use_outside_assistant(i))
                }
                MessagesContentBlock::WebSearchToolResult { .. } => {
                    return Err(web_search_result_outside_assistant(i))
                }
                MessagesContentBlock::ToolAddition { .. } => {
                    return Err(addition_outside_system(i))
                }
                MessagesContentBlock::ToolResult { .. } => unreachable!("handled above"),
            };
            self.out.push(message);
        }
        if !self.pending.is_empty() {
            return Err(unanswered(
                &format!("messages.{}", self.pending_at),
                "",
                &self.pending,
            ));
        }
        Ok(())
    }

    fn assistant(&mut self, i: usize, blocks: &[MessagesContentBlock]) -> Result<()> {
        self.check_answered(i)?;
        let mut texts: Vec<String> = Vec::new();
        let mut thoughts: Vec<&str> = Vec::new();
        let mut calls: Vec<ToolCall> = Vec::new();
        for (j, block) in blocks.iter().enumerate() {
            let after_calls = || {
                let ids: Vec<String> = calls.iter().map(|c| c.id.clone()).collect();
                unanswered(&format!("messages.{i}.{j}"), " ", &ids)
            };
            match block {
                MessagesContentBlock::Text { text } => {
                    if !calls.is_empty() {
                        return Err(after_calls());
                    }
                    texts.push(text.clone());
                }
                MessagesContentBlock::Thinking { thinking, .. } => {
                    if !calls.is_empty() {
                        return Err(after_calls());
                    }
                    thoughts.push(thinking);
                }
                MessagesContentBlock::ToolUse { id, name, input } => calls.push(ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: pyjson::to_string(input, NumberStyle::V4),
                }),
                MessagesContentBlock::Image { .. } => {
                    return Err(bad("Image in assistant message is unsupported"))
                }
                MessagesContentBlock::ServerToolUse { .. }
                | MessagesContentBlock::WebSearchToolResult { .. } => {
                    return Err(bad(
                        "Unsupported content block: server tools are not supported",
                    ))
                }
                MessagesContentBlock::ToolAddition { .. } => {
                    return Err(addition_outside_system(i))
                }
                MessagesContentBlock::Document { source } => {
                    if !calls.is_empty() {
                        return Err(after_calls());
                    }
                    texts.push(document(source));
                }
                MessagesContentBlock::ToolResult { .. } => {
                    return Err(bad(format!(
                        "messages.{i}: `tool_result` blocks can only be in `user` messages"
                    )))
                }
            }
        }
        let reasoning = (!thoughts.is_empty()).then(|| thoughts.join("\n\n"));
        self.pending = calls.iter().map(|c| c.id.clone()).collect();
        self.pending_at = i;
        let calls = (!calls.is_empty()).then_some(calls);
        self.out.push(Message::assistant(
            texts.join("\n\n"),
            reasoning,
            calls,
            false,
        ));
        Ok(())
    }

    fn system(&mut self, i: usize, blocks: &[MessagesContentBlock]) -> Result<()> {
        self.check_answered(i)?;
        let mut text = common::BlockText::default();
        let mut images = Vec::new();
        let mut added: Vec<String> = Vec::new();
        for (j, block) in blocks.iter().enumerate() {
            match block {
                MessagesContentBlock::Text { text: t } => text.push_text(t),
                MessagesContentBlock::Image { source } => {
                    let path = format!("messages.{i}.content[{j}]");
                    let image = self.image(source, &path, &path)?;
                    add_image(&mut text, &mut images, image);
                }
                MessagesContentBlock::Document { source } => text.push_text(&document(source)),
                MessagesContentBlock::ToolAddition {
                    tool: MessagesToolReference::ToolReference { name },
                } => {
                    if !self.declared.contains(name) {
                        return Err(bad(format!(
                            "messages.{i}.content.{j}: `tool_addition` references unknown tool '{name}'"
                        )));
                    }
                    added.push(name.clone());
                }
                MessagesContentBlock::Thinking { .. } => return Err(thinking_outside_assistant(i)),
                MessagesContentBlock::ToolUse { .. }
                | MessagesContentBlock::ServerToolUse { .. } => {
                    return Err(tool_use_outside_assistant(i))
                }
                MessagesContentBlock::ToolResult { .. } => {
                    return Err(bad(format!(
                        "messages.{i}: `tool_result` blocks can only be in `user` messages"
                    )))
                }
                MessagesContentBlock::WebSearchToolResult { .. } => {
                    return Err(web_search_result_outside_assistant(i))
                }
            }
        }
        let (content, spans) = text.finish();
        match self.version {
            ModelVersion::DeepseekV41Flash => {
                if !added.is_empty() {
                    self.additions.push((self.out.len(), added));
                }
                self.out.push(Message::with_placeholders(
                    Role::System,
                    content,
                    images,
                    spans,
                ));
            }
            // V4 has no mid-conversation system turn: a reminder in a user turn, if any text.
            ModelVersion::DeepseekV4Pro if content.is_empty() => {}
            ModelVersion::DeepseekV4Pro => self.out.push(plain(
                Role::User,
                format!("<system-reminder>\n{content}\n</system-reminder>"),
            )),
        }
        Ok(())
    }

    /// A tool message, and the tools its `tool_reference` blocks name (they load those tools
    /// like a `tool_addition`).
    fn tool_result(
        &self,
        i: usize,
        j: usize,
        id: &str,
        content: Option<&TextOrList<ToolResultBlock>>,
    ) -> Result<(Message, Vec<String>)> {
        let mut references = Vec::new();
        let mut text = common::BlockText::default();
        let mut images = Vec::new();
        match content {
            None => {}
            Some(TextOrList::Text(s)) => text.push_text(s),
            Some(TextOrList::List(blocks)) => {
                for (k, block) in blocks.iter().enumerate() {
                    match &block.0 {
                        MessagesToolResultBlock::Text { text: t } => text.push_text(t),
                        MessagesToolResultBlock::Image { source } => {
                            let path = format!("messages.{i}.content.{j}.tool_result");
                            let at = format!("{path}.content[{k}]");
                            let image = self.image(source, &path, &at)?;
                            add_image(&mut text, &mut images, image);
                        }
                        MessagesToolResultBlock::Document { source } => {
                            text.push_text(&document(source))
                        }
                        MessagesToolResultBlock::ToolReference { tool_name } => {
                            if !self.declared.contains(tool_name) {
                                return Err(bad(format!(
                                    "messages.{i}.content.{j}: tool reference '{tool_name}' not found in available tools"
                                )));
                            }
                            text.push_text(tool_name);
                            references.push(tool_name.clone());
                        }
                    }
                }
            }
        }
        let (content, spans) = text.finish();
        let mut message = Message::with_placeholders(Role::Tool, content, images, spans);
        message.tool_call_id = Some(id.to_string());
        Ok((message, references))
    }

    /// An image block: the image token and its source on V4.1, a text placeholder on V4 (which
    /// has no vision), after the source is checked. `path` is the source's location, `at` the
    /// one errors name (inside a tool result they name the block within the result).
    fn image(
        &self,
        source: &MessagesImageSource,
        path: &str,
        at: &str,
    ) -> Result<(String, Vec<ImageSource>)> {
        if self.version == ModelVersion::DeepseekV4Pro {
            return Ok((UNSUPPORTED_IMAGE_TEXT.to_string(), Vec::new()));
        }
        let data = match source {
            MessagesImageSource::Base64 { media_type, data } => {
                let Some(data) = images::canonical_bare_base64(data) else {
                    return Err(bad(format!("{at}: base64 decode error")));
                };
                ImageData::DataUrl(format!("data:{};base64,{data}", media_type.as_str()))
            }
            MessagesImageSource::Url { url } => {
                if !images::is_web_url(url) {
                    return Err(bad(format!("{at}: invalid url: {url:?}")));
                }
                ImageData::Url(url.clone())
            }
            MessagesImageSource::File {} => {
                return Err(bad(format!(
                    "{at}: file_id is not supported. Pass the image as a base64 data url instead."
                )))
            }
        };
        Ok((
            self.image_token.to_string(),
            vec![images::source(data, ImageDetail::High, path)],
        ))
    }
}

pub(super) fn plain(role: Role, content: String) -> Message {
    Message::with_placeholders(role, content, Vec::new(), Vec::new())
}

/// Append an image block's text: the image token with its source, or (V4) the placeholder text.
fn add_image(
    text: &mut common::BlockText,
    images: &mut Vec<ImageSource>,
    (placeholder, found): (String, Vec<ImageSource>),
) {
    if found.is_empty() {
        text.push_text(&placeholder);
    } else {
        text.push_image(&placeholder);
        images.extend(found);
    }
}

fn thinking_outside_assistant(i: usize) -> ConversionError {
    bad(format!(
        "messages.{i}.content: thinking blocks may only be in `assistant` messages"
    ))
}

fn tool_use_outside_assistant(i: usize) -> ConversionError {
    bad(format!(
        "messages.{i}: `tool_use` blocks can only be in `assistant` messages"
    ))
}

fn web_search_result_outside_assistant(i: usize) -> ConversionError {
    bad(format!(
        "messages.{i}: `web_search_tool_result` blocks can only be in `assistant` messages"
    ))
}

fn addition_outside_system(i: usize) -> ConversionError {
    bad(format!(
        "messages.{i}: `tool_addition` blocks can only be in `system` messages"
    ))
}

/// The placeholder a document block becomes.
fn document(source: &MessagesDocumentSource) -> String {
    let media = source.media_type.as_deref().unwrap_or("unknown");
    format!("[Unsupported document type: {media}]")
}
