//! Chat Completions wire types (field order and types follow deepseek-recipe, so shape errors
//! read the same).

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::conversation::ImageDetail;
use crate::request::common::Effort;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ChatCompletionRequest")]
pub struct ChatCompletionRequest {
    pub messages: Vec<ChatCompletionRequestMessage>,
    pub model: String,
    pub frequency_penalty: Option<f32>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u8>,
    pub max_tokens: Option<u32>,
    pub n: Option<u8>,
    pub presence_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<StringOrList>,
    pub stream: Option<bool>,
    pub stream_options: Option<ChatCompletionStreamOptions>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub response_format: Option<ChatCompletionResponseFormat>,
    pub tools: Option<Vec<ChatCompletionTool>>,
    pub tool_choice: Option<ChatToolChoice>,
    pub reasoning_effort: Option<ChatReasoningEffort>,
    pub thinking: Option<ChatCompletionThinking>,
    pub parallel_tool_calls: Option<bool>,
    /// Read from the raw body (not a serde field, which would also change the field count that
    /// serde's messages for array bodies report): deepseek-recipe ignores it, we honour it
    /// (recipe/DEVIATIONS.md).
    #[serde(skip)]
    pub max_completion_tokens: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(
    rename = "ChatCompletionRequestMessage",
    tag = "role",
    rename_all = "snake_case"
)]
pub enum ChatCompletionRequestMessage {
    System {
        content: Content,
        /// Type-checked (a string) as the official does, and not used.
        #[allow(dead_code)]
        name: Option<String>,
    },
    User {
        content: Content,
        #[allow(dead_code)]
        name: Option<String>,
    },
    Assistant {
        content: Option<Content>,
        #[allow(dead_code)]
        name: Option<String>,
        reasoning_content: Option<String>,
        tool_calls: Option<Vec<ChatCompletionRequestToolCall>>,
        prefix: Option<bool>,
    },
    Tool {
        content: Content,
        tool_call_id: String,
    },
    LatestReminder {
        content: String,
    },
}

/// A string or a list of content blocks.
#[derive(Debug, Clone)]
pub enum Content {
    Text(String),
    Parts(Vec<ChatCompletionRequestContentBlock>),
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Content::Text(s)),
            Value::Array(items) => serde_json::from_value(Value::Array(items))
                .map(Content::Parts)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom("content should be a string or a list")),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(
    rename = "ChatCompletionRequestContentBlock",
    tag = "type",
    rename_all = "snake_case"
)]
pub enum ChatCompletionRequestContentBlock {
    Text {
        text: String,
    },
    ImageUrl {
        image_url: ChatCompletionImageUrl,
    },
    File {
        file_id: Option<String>,
        file_data: Option<String>,
    },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ChatCompletionImageUrl")]
pub struct ChatCompletionImageUrl {
    pub url: String,
    pub detail: Option<WireDetail>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireDetail {
    Low,
    High,
    Original,
    Auto,
}

impl From<WireDetail> for ImageDetail {
    fn from(d: WireDetail) -> Self {
        match d {
            WireDetail::Low => ImageDetail::Low,
            WireDetail::High => ImageDetail::High,
            WireDetail::Original => ImageDetail::Original,
            WireDetail::Auto => ImageDetail::Auto,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ChatCompletionRequestToolCall")]
pub struct ChatCompletionRequestToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: FunctionType,
    pub function: ChatCompletionRequestFunctionCall,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FunctionType {
    Function,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ChatCompletionRequestFunctionCall")]
pub struct ChatCompletionRequestFunctionCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ChatCompletionTool")]
pub struct ChatCompletionTool {
    #[serde(rename = "type")]
    pub kind: FunctionType,
    pub function: ChatCompletionFunctionDefinition,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ChatCompletionFunctionDefinition")]
pub struct ChatCompletionFunctionDefinition {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ChatCompletionStreamOptions")]
pub struct ChatCompletionStreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(
    rename = "ChatCompletionResponseFormat",
    tag = "type",
    rename_all = "snake_case"
)]
pub enum ChatCompletionResponseFormat {
    JsonObject,
    JsonSchema {
        json_schema: ChatCompletionResponseFormatJsonSchema,
    },
    Regex {
        regex: String,
    },
    Text,
}

#[derive(Debug, Clone, Deserialize)]
// Named as the official names it: serde's "expected struct ..." messages use the Rust name.
// No `description`: the official does not read it (any value passes).
pub struct ChatCompletionResponseFormatJsonSchema {
    pub name: Option<String>,
    pub schema: Value,
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatReasoningEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
    Ultra,
    Max,
}

impl From<ChatReasoningEffort> for Effort {
    fn from(e: ChatReasoningEffort) -> Self {
        match e {
            ChatReasoningEffort::None => Effort::None,
            ChatReasoningEffort::Minimal | ChatReasoningEffort::Low => Effort::Low,
            ChatReasoningEffort::Medium | ChatReasoningEffort::High => Effort::High,
            ChatReasoningEffort::Xhigh => Effort::XHigh,
            ChatReasoningEffort::Ultra | ChatReasoningEffort::Max => Effort::Max,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ChatCompletionThinking")]
pub struct ChatCompletionThinking {
    #[serde(rename = "type")]
    pub kind: ThinkingType,
    pub budget_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThinkingType {
    Adaptive,
    Enabled,
    Disabled,
}

/// `"a"` or `["a", "b"]`.
#[derive(Debug, Clone)]
pub enum StringOrList {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for StringOrList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(StringOrList::One(s)),
            Value::Array(items) => serde_json::from_value(Value::Array(items))
                .map(StringOrList::Many)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom("expected a string or a list")),
        }
    }
}

/// `"none" | "auto" | "required"` or `{"type": "function", "function": {"name": ...}}`.
#[derive(Debug, Clone)]
pub enum ChatToolChoice {
    None,
    Auto,
    Required,
    Function(String),
}

/// Named as the official names it: serde's "expected struct ..." messages use the Rust name.
#[derive(Deserialize)]
struct ChatCompletionToolChoiceFunction {
    name: String,
}

impl<'de> Deserialize<'de> for ChatToolChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        const EXPECTED: &str = "expected one of `none`, `auto`, `required` or a tool";
        match Value::deserialize(d)? {
            Value::String(s) => match s.as_str() {
                "none" => Ok(ChatToolChoice::None),
                "auto" => Ok(ChatToolChoice::Auto),
                "required" => Ok(ChatToolChoice::Required),
                _ => Err(D::Error::custom(EXPECTED)),
            },
            Value::Object(mut map) => {
                let Some(kind) = map.remove("type") else {
                    return Err(D::Error::custom(EXPECTED));
                };
                serde_json::from_value::<FunctionType>(kind)
                    .map_err(|e| D::Error::custom(format!("field `type`: {e}")))?;
                let function = map.remove("function").unwrap_or(Value::Null);
                let f: ChatCompletionToolChoiceFunction = serde_json::from_value(function)
                    .map_err(|e| D::Error::custom(format!("field `function`: {e}")))?;
                Ok(ChatToolChoice::Function(f.name))
            }
            _ => Err(D::Error::custom(EXPECTED)),
        }
    }
}
