//! The model-agnostic conversation: what protocol conversion produces and rendering consumes.

use serde_json::Value;

use crate::error::RecipeError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
    LatestReminder,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::LatestReminder => "latest_reminder",
        }
    }
}

/// A tool call in the history; `arguments` is the caller's string, expected to be a JSON object.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A client tool. `parameters` is its JSON Schema (`Value::Null` when absent).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDefinition {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Value,
    pub strict: Option<bool>,
    pub defer_loading: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ImageDetail {
    Low,
    #[default]
    High,
    Original,
    Auto,
}

impl ImageDetail {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageDetail::Low => "low",
            ImageDetail::High => "high",
            ImageDetail::Original => "original",
            ImageDetail::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "low" => ImageDetail::Low,
            "high" => ImageDetail::High,
            "original" => ImageDetail::Original,
            "auto" => ImageDetail::Auto,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ImageData {
    DataUrl(String),
    Url(String),
    Bytes(Vec<u8>),
}

/// An image attached to a message; `path` is its request location for error messages.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageSource {
    pub data: ImageData,
    pub detail: ImageDetail,
    pub path: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    pub reasoning_content: Option<String>,
    pub tool_calls: Option<Vec<ToolCall>>,
    pub tool_call_id: Option<String>,
    pub prefix: bool,
    pub image_sources: Vec<ImageSource>,
    /// Byte spans of `content` that are image placeholders: the first occurrences of the image
    /// token, one per image source, found when the message was built.
    pub image_placeholders: Vec<(usize, usize)>,
    /// Tools a system message adds (rendered by V4.1 as "Updated Tool Schemas").
    pub tools: Option<Vec<ToolDefinition>>,
}

impl Message {
    fn plain(role: Role, content: String) -> Self {
        Message {
            role,
            content,
            reasoning_content: None,
            tool_calls: None,
            tool_call_id: None,
            prefix: false,
            image_sources: Vec::new(),
            image_placeholders: Vec::new(),
            tools: None,
        }
    }

    fn with_images(
        mut self,
        images: Vec<ImageSource>,
        image_token: &str,
    ) -> Result<Self, RecipeError> {
        if image_token.is_empty() {
            return Err(RecipeError::InvalidArgument(
                "image_token must not be empty".into(),
            ));
        }
        if images.is_empty() {
            return Ok(self); // nothing to place: skip building a substring searcher
        }
        self.image_placeholders = self
            .content
            .match_indices(image_token)
            .take(images.len())
            .map(|(i, m)| (i, i + m.len()))
            .collect();
        self.image_sources = images;
        Ok(self)
    }

    pub fn system(
        content: String,
        images: Vec<ImageSource>,
        tools: Option<Vec<ToolDefinition>>,
        image_token: &str,
    ) -> Result<Self, RecipeError> {
        let mut m = Message::plain(Role::System, content).with_images(images, image_token)?;
        m.tools = tools;
        Ok(m)
    }

    pub fn user(
        content: String,
        images: Vec<ImageSource>,
        image_token: &str,
    ) -> Result<Self, RecipeError> {
        Message::plain(Role::User, content).with_images(images, image_token)
    }

    pub fn assistant(
        content: String,
        reasoning_content: Option<String>,
        tool_calls: Option<Vec<ToolCall>>,
        prefix: bool,
    ) -> Self {
        let mut m = Message::plain(Role::Assistant, content);
        m.reasoning_content = reasoning_content;
        m.tool_calls = tool_calls;
        m.prefix = prefix;
        m
    }

    pub fn tool(
        content: String,
        tool_call_id: Option<String>,
        images: Vec<ImageSource>,
        image_token: &str,
    ) -> Result<Self, RecipeError> {
        let mut m = Message::plain(Role::Tool, content).with_images(images, image_token)?;
        m.tool_call_id = tool_call_id;
        Ok(m)
    }

    /// A message built by protocol conversion, which knows exactly where it put each image
    /// placeholder (a placeholder-like text in the user's own words is not one).
    pub fn with_placeholders(
        role: Role,
        content: String,
        images: Vec<ImageSource>,
        placeholders: Vec<(usize, usize)>,
    ) -> Self {
        let mut m = Message::plain(role, content);
        m.image_sources = images;
        m.image_placeholders = placeholders;
        m
    }

    pub fn latest_reminder(content: String) -> Self {
        Message::plain(Role::LatestReminder, content)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ToolChoice {
    #[default]
    Auto,
    None,
    Required,
}

impl ToolChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolChoice::Auto => "auto",
            ToolChoice::None => "none",
            ToolChoice::Required => "required",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningEffort {
    Low,
    High,
    XHigh,
    Max,
}

impl ReasoningEffort {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "low",
            ReasoningEffort::High => "high",
            ReasoningEffort::XHigh => "xhigh",
            ReasoningEffort::Max => "max",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "low" => ReasoningEffort::Low,
            "high" => ReasoningEffort::High,
            "xhigh" => ReasoningEffort::XHigh,
            "max" => ReasoningEffort::Max,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Default)]
pub enum ResponseFormat {
    #[default]
    Text,
    JsonObject,
    JsonSchema(Value),
    Regex(String),
}

impl ResponseFormat {
    pub fn name(&self) -> &'static str {
        match self {
            ResponseFormat::Text => "text",
            ResponseFormat::JsonObject => "json_object",
            ResponseFormat::JsonSchema(_) => "json_schema",
            ResponseFormat::Regex(_) => "regex",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Conversation {
    pub messages: Vec<Message>,
    pub thinking_mode: bool,
    pub tools: Vec<ToolDefinition>,
    pub tool_choice: ToolChoice,
    pub reasoning_effort: Option<ReasoningEffort>,
    pub response_format: ResponseFormat,
}

impl Default for Conversation {
    fn default() -> Self {
        Conversation {
            messages: Vec::new(),
            thinking_mode: true,
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            reasoning_effort: None,
            response_format: ResponseFormat::Text,
        }
    }
}
