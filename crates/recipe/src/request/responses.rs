//! OpenAI Responses requests.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

use super::common::{
    self, bad, BlockText, ChoiceSpec, Effort, FormatSpec, Resolved, Result, ToolSpec,
};
use super::images;
use super::options::{ConversionOptions, WebSearchBehavior};
use super::ConversationRequest;
use crate::conversation::{ImageDetail, ImageSource, Message, ResponseFormat, Role, ToolCall};
use crate::error::{ConversionError, RecipeError};
use crate::render::ModelVersion;
use crate::request::chat::WireDetail;
use crate::special::SpecialToken;

/// The description deepseek-recipe gives the built-in `apply_patch` custom tool (the V4 text
/// has one blank line fewer).
const APPLY_PATCH_DESCRIPTION: &str = include_str!("apply_patch.txt");
const APPLY_PATCH_DESCRIPTION_V4: &str = include_str!("apply_patch_v4.txt");

fn apply_patch_parameters() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "input": {
                "type": "string",
                "description": "The entire contents of the apply_patch command (the *** Begin Patch ... *** End Patch envelope)."
            }
        },
        "required": ["input"]
    })
}

// ---------------------------------------------------------------------------------------------
// Wire types

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
            return Err(serde_json::Error::invalid_type(
                schema_unexpected(other),
                &"variant identifier",
            )
            .to_string())
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

/// serde's description of a JSON value in "invalid type" messages.
fn schema_unexpected(v: &Value) -> serde::de::Unexpected<'_> {
    use serde::de::Unexpected;
    match v {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Unexpected::Signed(i),
            (_, Some(u)) => Unexpected::Unsigned(u),
            _ => Unexpected::Float(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
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

// ---------------------------------------------------------------------------------------------
// Conversion

impl ResponsesRequest {
    pub fn from_body(body: super::RequestBody<'_>) -> std::result::Result<Self, RecipeError> {
        super::parse_body(body)
    }

    /// [`Self::from_body`], boxed (see [`super::parse_body_boxed`]).
    pub fn from_body_boxed(
        body: super::RequestBody<'_>,
    ) -> std::result::Result<Box<Self>, RecipeError> {
        super::parse_body_boxed(body)
    }

    /// Declared tools as conversion reads them. With `all` false only what the namespace map
    /// needs is checked: names, and the members of namespaces (custom and web-search tools are
    /// neither checked nor listed).
    fn tool_specs(
        &self,
        options: &ConversionOptions,
        version: ModelVersion,
        all: bool,
    ) -> Result<Vec<NamedSpec>> {
        let sep = namespace_separator(version);
        let mut out: Vec<NamedSpec> = Vec::new();
        for (i, tool) in self.tools.iter().flatten().enumerate() {
            match tool {
                ResponsesTool::Function(f) => {
                    common::check_tool_name(&f.name, &format!("tools[{i}].name"))?;
                    out.push(NamedSpec::plain(ToolSpec {
                        name: f.name.clone(),
                        description: f.description.clone(),
                        parameters: f.parameters.clone(),
                        strict: f.strict,
                        // Responses ignores `defer_loading` (only Messages honours it).
                        defer_loading: false,
                    }));
                }
                ResponsesTool::Custom { name, .. } if all => {
                    if name != "apply_patch" {
                        return Err(bad(format!(
                            "Unsupported custom tool: '{name}'. Only 'apply_patch' is supported."
                        )));
                    }
                    out.push(NamedSpec::plain(ToolSpec {
                        name: name.clone(),
                        description: Some(
                            match version {
                                ModelVersion::DeepseekV41Flash => APPLY_PATCH_DESCRIPTION,
                                ModelVersion::DeepseekV4Pro => APPLY_PATCH_DESCRIPTION_V4,
                            }
                            .to_string(),
                        ),
                        parameters: Some(apply_patch_parameters()),
                        strict: None,
                        defer_loading: false,
                    }));
                }
                ResponsesTool::Namespace {
                    name,
                    description,
                    tools,
                } => {
                    common::check_tool_name(name, &format!("tools[{i}].name"))?;
                    let mut members: Vec<&str> = Vec::new();
                    for (j, member) in tools.iter().enumerate() {
                        let f = match member {
                            ResponsesNamespaceTool::Custom { name: member } => {
                                return Err(bad(format!(
                                    "Currently custom tools are not allowed inside a namespace. Found custom tool '{member}' in tools[{i}].tools[{j}]."
                                )))
                            }
                            ResponsesNamespaceTool::Function(f) => f,
                        };
                        common::check_tool_name(&f.name, &format!("tools[{i}].tools[{j}].name"))?;
                        if members.contains(&f.name.as_str()) {
                            return Err(bad("Tool names within a namespace must be unique."));
                        }
                        members.push(&f.name);
                        // V4.1 prefixes the namespace description; V4-Pro keeps the member's.
                        let ns_description = description
                            .as_deref()
                            .filter(|d| !d.is_empty() && version == ModelVersion::DeepseekV41Flash);
                        let description = match ns_description {
                            Some(ns) => {
                                Some(format!("{ns}\n{}", f.description.as_deref().unwrap_or("")))
                            }
                            None => f.description.clone(),
                        };
                        // A flattened name taken by an earlier namespace gets a numeric suffix.
                        let base = format!("{name}{sep}{}", f.name);
                        let mut full = base.clone();
                        let mut k = 1;
                        while out.iter().any(|s| s.spec.name == full) {
                            full = format!("{base}_{k}");
                            k += 1;
                        }
                        out.push(NamedSpec {
                            spec: ToolSpec {
                                name: full,
                                description,
                                parameters: f.parameters.clone(),
                                strict: f.strict,
                                defer_loading: false,
                            },
                            namespace: Some((name.clone(), f.name.clone())),
                        });
                    }
                }
                ResponsesTool::WebSearch(_) | ResponsesTool::WebSearch20250826(_)
                    if all && options.responses_web_search == WebSearchBehavior::Reject =>
                {
                    return Err(bad("Server tools are not supported"));
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// `(function name, namespace, local name)` of every declared namespace tool.
    pub fn namespace_tool_map(
        &self,
        options: &ConversionOptions,
    ) -> Result<Vec<(String, String, String)>> {
        let version = common::resolve_model(options, &self.model)?;
        Ok(self
            .tool_specs(options, version, false)?
            .into_iter()
            .filter_map(|s| s.namespace.map(|(ns, local)| (s.spec.name, ns, local)))
            .collect())
    }

    pub fn convert(
        self,
        options: &ConversionOptions,
    ) -> std::result::Result<ConversationRequest, ConversionError> {
        let version = common::resolve_model(options, &self.model)?;
        let tool_specs: Vec<ToolSpec> = self
            .tool_specs(options, version, true)?
            .into_iter()
            .map(|s| s.spec)
            .collect();
        let image_token = options.special_tokens.token(SpecialToken::Image);
        let vision = version == ModelVersion::DeepseekV41Flash;
        let mut messages = self.convert_input(image_token, vision)?;
        let choice = match &self.tool_choice {
            None | Some(ResponsesToolChoice::Auto) => ChoiceSpec::Auto,
            Some(ResponsesToolChoice::None) => ChoiceSpec::None,
            Some(ResponsesToolChoice::Required) => ChoiceSpec::Required,
            Some(ResponsesToolChoice::Object(o)) => match o {
                ToolChoiceObject::Function { name } | ToolChoiceObject::Custom { name } => {
                    ChoiceSpec::Named(name.clone())
                }
                ToolChoiceObject::WebSearch {} | ToolChoiceObject::WebSearch20250826 {} => {
                    if options.responses_web_search == WebSearchBehavior::Reject {
                        return Err(bad("Server tools are not supported"));
                    }
                    ChoiceSpec::Auto
                }
            },
        };
        let declared = !tool_specs.is_empty();

        let switch = None;
        let effort = self
            .reasoning
            .as_ref()
            .and_then(|r| r.effort)
            .map(Effort::from);
        let (thinking, reasoning_effort) = common::resolve_thinking(switch, effort, options);
        // Declared tools count, even when `tool_choice: none` drops them.
        common::apply_reasoning_policy(
            &mut messages,
            thinking,
            declared,
            options,
            "reasoning_text",
        )?;
        let mut tools = common::finalize_tools(tool_specs, &choice)?;
        let tool_choice = common::resolve_tool_choice(choice, &mut tools, thinking)?;

        let format_spec = match self.text.as_ref().map(|t| t.format.clone()) {
            None | Some(ResponsesTextFormat::Text) => FormatSpec::Text,
            Some(ResponsesTextFormat::JsonObject) => FormatSpec::JsonObject,
            Some(ResponsesTextFormat::JsonSchema { schema, strict, .. }) => {
                FormatSpec::JsonSchema {
                    schema,
                    strict: strict == Some(true),
                }
            }
        };
        if matches!(format_spec, FormatSpec::JsonObject) && !common::mentions_json(&messages) {
            return Err(bad(
                "Response input messages must contain the word 'json' in some form to use 'text.format' of type 'json_object'.",
            ));
        }
        let (format, format_constraint) = common::finalize_format(format_spec)?;
        // Only a JSON format conflicts with strict tools here (Chat counts any format).
        let json_format = !matches!(format, ResponseFormat::Text | ResponseFormat::Regex(_));
        common::check_tool_rules(false, &tools, &messages, &format, json_format)?;
        common::check_temperature(self.temperature)?;
        common::check_top_p(self.top_p)?;
        if self.top_logprobs.is_some_and(|n| n > 20) {
            return Err(bad(
                "Invalid top_logprobs value, the valid range of top_logprobs is [0, 20].",
            ));
        }
        common::check_max_tokens(self.max_output_tokens, thinking, options)?;

        // Calls of declared custom tools come back as `custom_tool_call` items.
        let custom_tools = self
            .tools
            .iter()
            .flatten()
            .filter_map(|t| match t {
                ResponsesTool::Custom { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect();
        Ok(common::assemble(
            Resolved {
                version,
                thinking,
                reasoning_effort,
                messages,
                tools,
                tool_choice,
                format,
                format_constraint,
                stop_sequences: Vec::new(),
                max_tokens: self.max_output_tokens,
                temperature: self.temperature,
                top_p: self.top_p,
                logprobs: self.top_logprobs.is_some(),
                top_logprobs: self.top_logprobs,
                seed: None,
                stream: self.stream.unwrap_or(false),
                output: super::OutputOptions {
                    custom_tools,
                    ..Default::default()
                },
            },
            options,
        ))
    }

    fn convert_input(&self, image_token: &str, vision: bool) -> Result<Vec<Message>> {
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

/// How a namespace and a member name are joined into a function name: V4-Pro tool names cannot
/// hold `::`.
fn namespace_separator(version: ModelVersion) -> &'static str {
    match version {
        ModelVersion::DeepseekV41Flash => "::",
        ModelVersion::DeepseekV4Pro => "__",
    }
}

/// A declared tool and, for a namespace member, its namespace and local name.
struct NamedSpec {
    spec: ToolSpec,
    namespace: Option<(String, String)>,
}

impl NamedSpec {
    fn plain(spec: ToolSpec) -> Self {
        NamedSpec {
            spec,
            namespace: None,
        }
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
                    texts.push_text(super::chat::UNSUPPORTED_IMAGE_TEXT)
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
                    texts.push_text(super::chat::UNSUPPORTED_IMAGE_TEXT)
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
