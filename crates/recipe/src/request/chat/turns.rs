//! Chat messages -> conversation messages: content blocks joined into text with their images,
//! tool-call sequencing and prefixes checked.

use super::wire::{ChatCompletionRequestContentBlock, ChatCompletionRequestMessage, Content};
use crate::conversation::{ImageData, ImageDetail, ImageSource, Message, Role, ToolCall};
use crate::error::ConversionError;
use crate::request::common::{bad, BlockText, Result};
use crate::request::images::{self, DataUrlError, UNSUPPORTED_FILE};

/// Joins content blocks into message text (blocks separated by blank lines, each image as one
/// image token) and collects the images.
struct ContentBuilder<'a> {
    text: BlockText,
    images: Vec<PendingImage>,
    image_token: &'a str,
    /// V4-Pro has no vision: every image or file becomes a text placeholder, unchecked.
    vision: bool,
    /// The message's index; its path is formatted only for an image or an error.
    index: usize,
}

/// An image of a message being read. An `image_url` is checked only once the whole message was
/// read (a later part's error, or an assistant's image, is reported first, as the official
/// does); a `file` part is checked where it stands.
enum PendingImage {
    Ready(ImageSource),
    Url(String, ImageDetail),
}

/// What a V4-Pro prompt shows in place of an image.
pub(crate) const UNSUPPORTED_IMAGE_TEXT: &str = "[Unsupported Image]";

impl<'a> ContentBuilder<'a> {
    fn new(image_token: &'a str, vision: bool, index: usize) -> Self {
        ContentBuilder {
            text: BlockText::default(),
            images: Vec::new(),
            image_token,
            vision,
            index,
        }
    }

    fn path(&self) -> String {
        format!(".messages[{}]", self.index)
    }

    fn error(&self, message: &str) -> ConversionError {
        bad(format!("{}: {message}", self.path()))
    }

    fn push_image(&mut self, image: PendingImage) {
        self.images.push(image);
        self.text.push_image(self.image_token);
    }

    /// The image an `image_url` names, checked.
    fn url_image(&self, url: &str, detail: ImageDetail) -> Result<ImageSource> {
        let data = images::url_image_data(url).map_err(|m| self.error(m))?;
        Ok(images::source(data, detail, &self.path()))
    }

    fn add(&mut self, content: Content) -> Result<()> {
        let parts = match content {
            Content::Text(s) => {
                self.text.push_text(&s);
                return Ok(());
            }
            Content::Parts(p) => p,
        };
        for part in parts {
            match part {
                ChatCompletionRequestContentBlock::Text { text } => self.text.push_text(&text),
                _ if !self.vision => self.text.push_text(UNSUPPORTED_IMAGE_TEXT),
                ChatCompletionRequestContentBlock::ImageUrl { image_url } => {
                    let detail = image_url
                        .detail
                        .map_or(ImageDetail::High, ImageDetail::from);
                    self.push_image(PendingImage::Url(image_url.url, detail));
                }
                ChatCompletionRequestContentBlock::File { file_id, file_data } => {
                    // deepseek-recipe reads these at the block's top level, not under `file`.
                    if let Some(data) = file_data {
                        match images::check_data_url(&data) {
                            Ok(()) => {
                                let source = images::source(
                                    ImageData::DataUrl(data),
                                    ImageDetail::High,
                                    &self.path(),
                                );
                                self.push_image(PendingImage::Ready(source));
                            }
                            Err(DataUrlError::UnsupportedType) => {
                                return Err(self.error(UNSUPPORTED_FILE))
                            }
                            Err(_) => {
                                return Err(self.error("file_data is not a valid base64 data url"))
                            }
                        }
                    } else if file_id.is_some() {
                        return Err(self.error(
                            "file_id is not supported. Pass the image as a base64 data url instead.",
                        ));
                    } else {
                        return Err(self.error("file must have a file_id or file_data"));
                    }
                }
            }
        }
        Ok(())
    }

    fn into_message(mut self, role: Role) -> Result<Message> {
        let pending = std::mem::take(&mut self.images);
        let mut sources = Vec::with_capacity(pending.len());
        for image in pending {
            sources.push(match image {
                PendingImage::Ready(source) => source,
                PendingImage::Url(url, detail) => self.url_image(&url, detail)?,
            });
        }
        let (text, placeholders) = self.text.finish();
        Ok(Message::with_placeholders(
            role,
            text,
            sources,
            placeholders,
        ))
    }
}

/// Chat messages -> conversation messages, checking tool-call sequencing and prefixes.
pub(super) fn convert_messages(
    messages: Vec<ChatCompletionRequestMessage>,
    image_token: &str,
    vision: bool,
) -> Result<Vec<Message>> {
    if messages.is_empty() {
        return Err(bad("Empty input messages"));
    }
    let count = messages.len();
    let mut out = Vec::with_capacity(count);
    // Call ids of the last assistant message still waiting for their tool results.
    let mut pending: Option<Vec<String>> = None;
    // Checked after every message passed its own checks, as deepseek-recipe does.
    let mut misplaced_prefix = false;
    for (i, m) in messages.into_iter().enumerate() {
        let is_tool = matches!(m, ChatCompletionRequestMessage::Tool { .. });
        if !is_tool && pending.as_ref().is_some_and(|p| !p.is_empty()) {
            return Err(insufficient_tool_messages());
        }
        if !is_tool {
            pending = None;
        }
        let mut builder = ContentBuilder::new(image_token, vision, i);
        let message = match m {
            ChatCompletionRequestMessage::System { content, .. } => {
                builder.add(content)?;
                // An empty system message is dropped.
                if builder.text.is_empty() {
                    continue;
                }
                builder.into_message(Role::System)?
            }
            ChatCompletionRequestMessage::User { content, .. } => {
                builder.add(content)?;
                builder.into_message(Role::User)?
            }
            ChatCompletionRequestMessage::LatestReminder { content } => {
                Message::latest_reminder(content)
            }
            ChatCompletionRequestMessage::Tool {
                content,
                tool_call_id,
            } => {
                match pending.as_mut() {
                    Some(ids) if !ids.is_empty() => match ids.iter().position(|id| *id == tool_call_id) {
                        Some(pos) => {
                            ids.remove(pos);
                        }
                        None => {
                            return Err(bad(format!(
                                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id', The following tool_call_ids did not have response messages: {tool_call_id}"
                            )))
                        }
                    },
                    _ => {
                        return Err(bad(
                            "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'",
                        ))
                    }
                }
                builder.add(content)?;
                let mut m = builder.into_message(Role::Tool)?;
                m.tool_call_id = Some(tool_call_id);
                m
            }
            ChatCompletionRequestMessage::Assistant {
                content,
                reasoning_content,
                tool_calls,
                prefix,
                ..
            } => {
                let prefix = prefix.unwrap_or(false);
                misplaced_prefix |= prefix && i + 1 != count;
                if content.is_none() && tool_calls.is_none() {
                    return Err(bad(
                        "Invalid assistant message: content or tool_calls must be set",
                    ));
                }
                if tool_calls.as_ref().is_some_and(Vec::is_empty) {
                    return Err(bad(format!(
                        "Invalid 'messages[{i}].tool_calls': empty array. Expected an array with minimum length 1, but got an empty array instead."
                    )));
                }
                if let Some(c) = content {
                    builder.add(c)?;
                }
                if !builder.images.is_empty() {
                    return Err(bad("Image in assistant message is not supported"));
                }
                let calls: Option<Vec<ToolCall>> = tool_calls.map(|calls| {
                    calls
                        .into_iter()
                        .map(|c| ToolCall {
                            id: c.id,
                            name: c.function.name,
                            arguments: c.function.arguments,
                        })
                        .collect()
                });
                pending = calls
                    .as_ref()
                    .map(|c| c.iter().map(|c| c.id.clone()).collect());
                let (text, _) = builder.text.finish();
                Message::assistant(text, reasoning_content, calls, prefix)
            }
        };
        out.push(message);
    }
    if pending.is_some_and(|p| !p.is_empty()) {
        return Err(insufficient_tool_messages());
    }
    if misplaced_prefix {
        return Err(bad(
            "Invalid completion message: prefix set true with message which is not final message or message role is not assistant",
        ));
    }
    Ok(out)
}

fn insufficient_tool_messages() -> ConversionError {
    bad("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. (insufficient tool messages following tool_calls message)")
}
