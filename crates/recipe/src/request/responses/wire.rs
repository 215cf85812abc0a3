//! Responses wire types of the request's settings, tools and tool choice.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::wire_items::ResponsesInput;
use crate::request::common::Effort;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesRequest")]
pub struct ResponsesRequest {
    pub model: String,
    pub input: Option<ResponsesInput>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub reasoning: Option<ResponsesReasoningConfig>,
    pub stream: Option<bool>,
    pub temperature: Option<f32>,
    pub text: Option<ResponsesTextConfig>,
    pub tool_choice: Option<ResponsesToolChoice>,
    pub tools: Option<Vec<ResponsesTool>>,
    pub top_logprobs: Option<u8>,
    pub top_p: Option<f32>,
    pub user: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesReasoningConfig")]
pub struct ResponsesReasoningConfig {
    pub effort: Option<ResponsesEffort>,
    pub summary: Option<ReasoningSummary>,
    /// Checked like `summary` (as the official does) and not used.
    pub generate_summary: Option<ReasoningSummary>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningSummary {
    Auto,
    Concise,
    Detailed,
}

impl ReasoningSummary {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningSummary::Auto => "auto",
            ReasoningSummary::Concise => "concise",
            ReasoningSummary::Detailed => "detailed",
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResponsesEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
    Ultra,
    Max,
}

impl From<ResponsesEffort> for Effort {
    fn from(e: ResponsesEffort) -> Self {
        match e {
            ResponsesEffort::None => Effort::None,
            ResponsesEffort::Minimal | ResponsesEffort::Low => Effort::Low,
            ResponsesEffort::Medium | ResponsesEffort::High => Effort::High,
            ResponsesEffort::Xhigh => Effort::XHigh,
            ResponsesEffort::Ultra | ResponsesEffort::Max => Effort::Max,
        }
    }
}

impl ResponsesEffort {
    pub fn as_str(self) -> &'static str {
        match self {
            ResponsesEffort::None => "none",
            ResponsesEffort::Minimal => "minimal",
            ResponsesEffort::Low => "low",
            ResponsesEffort::Medium => "medium",
            ResponsesEffort::High => "high",
            ResponsesEffort::Xhigh => "xhigh",
            ResponsesEffort::Ultra => "ultra",
            ResponsesEffort::Max => "max",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesTextConfig")]
pub struct ResponsesTextConfig {
    /// Absent means text; `null` is refused (as the official does).
    #[serde(default)]
    pub format: ResponsesTextFormat,
    pub verbosity: Option<Verbosity>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verbosity {
    Low,
    Medium,
    High,
}

impl Verbosity {
    pub fn as_str(self) -> &'static str {
        match self {
            Verbosity::Low => "low",
            Verbosity::Medium => "medium",
            Verbosity::High => "high",
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(
    rename = "ResponsesTextFormat",
    tag = "type",
    rename_all = "snake_case"
)]
pub enum ResponsesTextFormat {
    #[default]
    Text,
    JsonSchema {
        name: String,
        schema: Value,
        description: Option<String>,
        strict: Option<bool>,
    },
    JsonObject,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesTool", tag = "type", rename_all = "snake_case")]
pub enum ResponsesTool {
    Function(ResponsesFunctionTool),
    /// The official reads no `description` here (any value passes).
    Custom {
        name: String,
        format: Option<Value>,
    },
    Namespace {
        name: String,
        description: Option<String>,
        tools: Vec<ResponsesNamespaceTool>,
    },
    WebSearch(ResponsesWebSearchTool),
    #[serde(rename = "web_search_2025_08_26")]
    WebSearch20250826(ResponsesWebSearchTool),
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesWebSearchTool")]
pub struct ResponsesWebSearchTool {
    pub search_context_size: Option<SearchContextSize>,
    pub user_location: Option<ResponsesUserLocation>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchContextSize {
    Low,
    Medium,
    High,
}

impl SearchContextSize {
    pub fn as_str(self) -> &'static str {
        match self {
            SearchContextSize::Low => "low",
            SearchContextSize::Medium => "medium",
            SearchContextSize::High => "high",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesUserLocation")]
pub struct ResponsesUserLocation {
    pub city: Option<String>,
    pub country: Option<String>,
    pub region: Option<String>,
    pub timezone: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesFunctionTool")]
pub struct ResponsesFunctionTool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
    // No `defer_loading`: Responses ignores it, and the official does not read it (any value
    // passes).
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponsesNamespaceTool {
    Function(ResponsesFunctionTool),
    Custom { name: String },
}

/// `"none" | "auto" | "required"` or a tool choice object.
#[derive(Debug, Clone)]
pub enum ResponsesToolChoice {
    None,
    Auto,
    Required,
    Object(ToolChoiceObject),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(
    rename = "ResponsesToolChoiceObject",
    tag = "type",
    rename_all = "snake_case"
)]
pub enum ToolChoiceObject {
    Function {
        name: String,
    },
    WebSearch {},
    #[serde(rename = "web_search_2025_08_26")]
    WebSearch20250826 {},
    Custom {
        name: String,
    },
}

impl<'de> Deserialize<'de> for ResponsesToolChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        const EXPECTED: &str = "expected one of `none`, `auto`, `required` or a tool choice object";
        match Value::deserialize(d)? {
            Value::String(s) => match s.as_str() {
                "none" => Ok(ResponsesToolChoice::None),
                "auto" => Ok(ResponsesToolChoice::Auto),
                "required" => Ok(ResponsesToolChoice::Required),
                _ => Err(D::Error::custom(EXPECTED)),
            },
            v @ Value::Object(_) if v.get("type").is_some() => serde_json::from_value(v)
                .map(ResponsesToolChoice::Object)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(EXPECTED)),
        }
    }
}
