//! Responses wire types of the `input` items.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::request::chat::WireDetail;
use crate::request::schema::unexpected;

/// `input`: a string or a list of items.
#[derive(Debug, Clone)]
pub enum ResponsesInput {
    Text(String),
    Items(Vec<InputItem>),
}

#[derive(Debug, Clone)]
pub enum InputItem {
    Message(ResponsesMessageItem),
    FunctionCall(ResponsesFunctionCallItem),
    FunctionCallOutput(ResponsesFunctionCallOutputItem),
    Reasoning(ResponsesReasoningItem),
    CustomToolCall(ResponsesCustomToolCallItem),
    CustomToolCallOutput(ResponsesCustomToolCallOutputItem),
    /// Item kinds that are accepted and dropped (item_reference, apply_patch_call, ...).
    Ignored,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesMessageItem")]
pub struct ResponsesMessageItem {
    pub role: ItemRole,
    pub content: ItemContent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ItemRole {
    User,
    Assistant,
    System,
    Developer,
}

#[derive(Debug, Clone)]
pub enum ItemContent {
    Text(String),
    Parts(Vec<ResponsesContentBlock>),
}

impl<'de> Deserialize<'de> for ItemContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(ItemContent::Text(s)),
            Value::Array(a) => serde_json::from_value(Value::Array(a))
                .map(ItemContent::Parts)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                "content should be a string or a list of content blocks",
            )),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponsesContentBlock {
    InputText {
        text: String,
    },
    OutputText {
        text: String,
    },
    InputImage {
        image_url: Option<String>,
        file_id: Option<String>,
        detail: Option<WireDetail>,
    },
    InputFile {},
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponsesToolCallOutputItem {
    InputText {
        text: String,
    },
    InputImage {
        image_url: Option<String>,
        file_id: Option<String>,
        detail: Option<WireDetail>,
    },
    InputFile {},
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesFunctionCallItem")]
pub struct ResponsesFunctionCallItem {
    pub call_id: String,
    pub name: String,
    pub arguments: String,
    pub namespace: Option<String>,
}

#[derive(Debug, Clone)]
pub enum ToolOutput {
    Text(String),
    Parts(Vec<ResponsesToolCallOutputItem>),
}

impl<'de> Deserialize<'de> for ToolOutput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(ToolOutput::Text(s)),
            Value::Array(a) => serde_json::from_value(Value::Array(a))
                .map(ToolOutput::Parts)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                "output should be a string or a list of output content parts",
            )),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesFunctionCallOutputItem")]
pub struct ResponsesFunctionCallOutputItem {
    pub call_id: Option<String>,
    pub output: ToolOutput,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesReasoningItem")]
pub struct ResponsesReasoningItem {
    pub content: Option<Vec<ResponsesReasoningContent>>,
    /// Type-checked (a string) as the official does, and not used.
    #[allow(dead_code)]
    encrypted_content: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesReasoningContent")]
pub struct ResponsesReasoningContent {
    pub text: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesCustomToolCallItem")]
pub struct ResponsesCustomToolCallItem {
    pub call_id: String,
    pub name: String,
    pub input: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "ResponsesCustomToolCallOutputItem")]
pub struct ResponsesCustomToolCallOutputItem {
    /// Required here (unlike a function call output's), as the official reads it.
    pub call_id: String,
    /// Absent or `null`: an empty output.
    pub output: Option<ToolOutput>,
}

fn item_from_value(v: Value) -> std::result::Result<InputItem, String> {
    let Value::Object(map) = &v else {
        return Err("invalid input item".into());
    };
    let field = |e: serde_json::Error| e.to_string();
    let kind = match map.get("type") {
        None if map.contains_key("role") => "message".to_string(),
        None => return Err("invalid input item".into()),
        Some(Value::String(t)) => t.clone(),
        Some(other) => {
            return Err(
                serde_json::Error::invalid_type(unexpected(other), &"variant identifier")
                    .to_string(),
            )
        }
    };
    Ok(match kind.as_str() {
        "message" => InputItem::Message(serde_json::from_value(v).map_err(field)?),
        "function_call" => InputItem::FunctionCall(serde_json::from_value(v).map_err(field)?),
        "function_call_output" => {
            InputItem::FunctionCallOutput(serde_json::from_value(v).map_err(field)?)
        }
        "reasoning" => InputItem::Reasoning(serde_json::from_value(v).map_err(field)?),
        "custom_tool_call" => InputItem::CustomToolCall(serde_json::from_value(v).map_err(field)?),
        "custom_tool_call_output" => {
            InputItem::CustomToolCallOutput(serde_json::from_value(v).map_err(field)?)
        }
        _ => InputItem::Ignored,
    })
}

impl<'de> Deserialize<'de> for ResponsesInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(ResponsesInput::Text(s)),
            Value::Array(items) => items
                .into_iter()
                .map(item_from_value)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(ResponsesInput::Items)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                "input should be a string or a list of input items",
            )),
        }
    }
}
