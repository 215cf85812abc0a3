//! OpenAI Chat Completions requests.

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer, SeqDeserializer};
use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::body::{read_fast, Key};

use super::common::{
    self, bad, BlockText, ChoiceSpec, Effort, FormatSpec, Resolved, Result, ToolSpec,
};
use super::images::{self, DataUrlError, UNSUPPORTED_FILE};
use super::options::ConversionOptions;
use super::ConversationRequest;
use crate::conversation::{ImageData, ImageDetail, ImageSource, Message, Role, ToolCall};
use crate::error::{ConversionError, RecipeError};
use crate::render::ModelVersion;
use crate::special::SpecialToken;

// ---------------------------------------------------------------------------------------------
// Wire types (field order and types follow deepseek-recipe, so shape errors read the same)

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

/// Reads a request object in one pass on the fast path (see [`read_fast`]): takes
/// `max_completion_tokens` out before the derived visitor sees the fields (so the limit needs no
/// second parse), and reads `messages` with [`FlatMessage`] instead of the internally tagged
/// enum, which buffers every message before reading it. Anything unusual (a repeated limit, a
/// message the flat reader cannot place) is an error here, which sends the body down the slow
/// path and its official messages.
struct FastRequest;

impl<'de> Visitor<'de> for FastRequest {
    type Value = (Box<ChatCompletionRequest>, Option<Value>);

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("struct ChatCompletionRequest")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Self::Value, A::Error> {
        let mut fields = FastFields {
            map,
            limit: None,
            messages: None,
            messages_next: false,
        };
        let mut request =
            ChatCompletionRequest::deserialize(MapAccessDeserializer::new(&mut fields))?;
        // The derived visitor got an empty list in place of the messages read here.
        if let Some(messages) = fields.messages {
            request.messages = messages;
        }
        Ok((Box::new(request), fields.limit.flatten()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Self::Value, A::Error> {
        let request = ChatCompletionRequest::deserialize(SeqAccessDeserializer::new(seq))?;
        Ok((Box::new(request), None))
    }
}

/// The entries of a request object as [`FastRequest`] hands them to the derived visitor.
struct FastFields<A> {
    map: A,
    limit: Option<Option<Value>>,
    messages: Option<Vec<ChatCompletionRequestMessage>>,
    /// The key just handed on was `messages`: its value is read here.
    messages_next: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for &mut FastFields<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> std::result::Result<Option<K::Value>, A::Error> {
        while let Some(key) = self.map.next_key::<Key<'de>>()? {
            match key.as_str() {
                "max_completion_tokens" => {
                    if self.limit.is_some() {
                        return Err(A::Error::custom("duplicate field `max_completion_tokens`"));
                    }
                    self.limit = Some(self.map.next_value()?);
                }
                name => {
                    self.messages_next = name == "messages";
                    return key.feed(seed).map(Some);
                }
            }
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> std::result::Result<V::Value, A::Error> {
        if !std::mem::take(&mut self.messages_next) {
            return self.map.next_value_seed(seed);
        }
        if self.messages.is_some() {
            return Err(A::Error::custom("duplicate field `messages`"));
        }
        let FlatMessages(messages) = self.map.next_value()?;
        self.messages = Some(messages);
        seed.deserialize(SeqDeserializer::new(std::iter::empty::<()>()))
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

/// A message list read with [`FlatMessage`].
struct FlatMessages(Vec<ChatCompletionRequestMessage>);

impl<'de> Deserialize<'de> for FlatMessages {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FlatMessages;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of messages")
            }
            fn visit_seq<S: SeqAccess<'de>>(
                self,
                mut seq: S,
            ) -> std::result::Result<FlatMessages, S::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(FlatMessage(m)) = seq.next_element()? {
                    out.push(m);
                }
                Ok(FlatMessages(out))
            }
        }
        d.deserialize_seq(V)
    }
}

/// One message read as an object holding every field any role has, then placed in its variant.
/// It accepts a subset of what the tagged enum accepts, with the same result: fields another role
/// would ignore must still have their type here, and a repeated key is an error (the tagged enum
/// reads the content through a value, where the last one wins).
struct FlatMessage(ChatCompletionRequestMessage);

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum FlatRole {
    System,
    User,
    Assistant,
    Tool,
    LatestReminder,
}

/// `content`: a string or a list of blocks, read directly (the tagged enum goes through a value).
enum FlatContent {
    Text(String),
    Parts(Vec<ChatCompletionRequestContentBlock>),
}

impl<'de> Deserialize<'de> for FlatContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FlatContent;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a list")
            }
            fn visit_str<E: serde::de::Error>(
                self,
                s: &str,
            ) -> std::result::Result<FlatContent, E> {
                Ok(FlatContent::Text(s.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(
                self,
                s: String,
            ) -> std::result::Result<FlatContent, E> {
                Ok(FlatContent::Text(s))
            }
            fn visit_seq<S: SeqAccess<'de>>(
                self,
                seq: S,
            ) -> std::result::Result<FlatContent, S::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(seq)).map(FlatContent::Parts)
            }
        }
        d.deserialize_any(V)
    }
}

impl From<FlatContent> for Content {
    fn from(c: FlatContent) -> Self {
        match c {
            FlatContent::Text(s) => Content::Text(s),
            FlatContent::Parts(p) => Content::Parts(p),
        }
    }
}

impl<'de> Deserialize<'de> for FlatMessage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FlatMessage;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a message object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<FlatMessage, A::Error> {
                fn put<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
                    map: &mut A,
                    slot: &mut Option<T>,
                ) -> std::result::Result<(), A::Error> {
                    if slot.is_some() {
                        return Err(A::Error::custom("duplicate field"));
                    }
                    *slot = Some(map.next_value()?);
                    Ok(())
                }
                // Outer `Some`: the key was seen (a second one is an error).
                let mut role: Option<FlatRole> = None;
                let mut content: Option<Option<FlatContent>> = None;
                let mut name: Option<Option<String>> = None;
                let mut reasoning_content: Option<Option<String>> = None;
                let mut tool_calls: Option<Option<Vec<ChatCompletionRequestToolCall>>> = None;
                let mut prefix: Option<Option<bool>> = None;
                let mut tool_call_id: Option<Option<String>> = None;
                while let Some(key) = map.next_key::<Key<'de>>()? {
                    match key.as_str() {
                        "role" => put(&mut map, &mut role)?,
                        "content" => put(&mut map, &mut content)?,
                        "name" => put(&mut map, &mut name)?,
                        "reasoning_content" => put(&mut map, &mut reasoning_content)?,
                        "tool_calls" => put(&mut map, &mut tool_calls)?,
                        "prefix" => put(&mut map, &mut prefix)?,
                        "tool_call_id" => put(&mut map, &mut tool_call_id)?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let missing = || A::Error::custom("not a simple message");
                let content = content.flatten();
                let name = name.flatten();
                let message = match role.ok_or_else(missing)? {
                    FlatRole::System => ChatCompletionRequestMessage::System {
                        content: content.ok_or_else(missing)?.into(),
                        name,
                    },
                    FlatRole::User => ChatCompletionRequestMessage::User {
                        content: content.ok_or_else(missing)?.into(),
                        name,
                    },
                    FlatRole::Assistant => ChatCompletionRequestMessage::Assistant {
                        content: content.map(Content::from),
                        name,
                        reasoning_content: reasoning_content.flatten(),
                        tool_calls: tool_calls.flatten(),
                        prefix: prefix.flatten(),
                    },
                    FlatRole::Tool => ChatCompletionRequestMessage::Tool {
                        content: content.ok_or_else(missing)?.into(),
                        tool_call_id: tool_call_id.flatten().ok_or_else(missing)?,
                    },
                    FlatRole::LatestReminder => match content {
                        Some(FlatContent::Text(content)) => {
                            ChatCompletionRequestMessage::LatestReminder { content }
                        }
                        _ => return Err(missing()),
                    },
                };
                Ok(FlatMessage(message))
            }
        }
        d.deserialize_map(V)
    }
}

// ---------------------------------------------------------------------------------------------
// Conversion

impl ChatCompletionRequest {
    /// Parse a body (see [`super::parse_body`]), reading `max_completion_tokens` on the side.
    pub fn from_body(body: super::RequestBody<'_>) -> std::result::Result<Self, RecipeError> {
        Self::from_body_boxed(body).map(|request| *request)
    }

    /// [`Self::from_body`], boxed (see [`super::parse_body_boxed`]).
    pub fn from_body_boxed(
        body: super::RequestBody<'_>,
    ) -> std::result::Result<Box<Self>, RecipeError> {
        let from_value = |value: Value| -> std::result::Result<_, RecipeError> {
            let limit = value.get("max_completion_tokens").cloned();
            Ok((
                super::parse_body_boxed(super::RequestBody::Value(value))?,
                limit,
            ))
        };
        let (mut request, limit): (Box<ChatCompletionRequest>, Option<Value>) = match body {
            // One pass: the typed fast path with the limit taken out on the way; anything it
            // does not read goes through a value, where a repeated key's last value wins (the
            // limit's too).
            super::RequestBody::Text(bytes) => {
                match read_fast(bytes, |de| de.deserialize_any(FastRequest)) {
                    Some(found) => found,
                    None => from_value(super::body::to_value(super::RequestBody::Text(bytes))?)?,
                }
            }
            super::RequestBody::Value(value) => from_value(value)?,
        };
        // Read like `max_tokens`, with the same message for a bad value.
        request.max_completion_tokens = match limit {
            None => None,
            Some(v) => Option::<u32>::deserialize(v)
                .map_err(|e| RecipeError::InvalidBody(format!("invalid request body: {e}")))?,
        };
        Ok(request)
    }

    pub fn convert(
        self,
        options: &ConversionOptions,
    ) -> std::result::Result<ConversationRequest, ConversionError> {
        let version = common::resolve_model(options, &self.model)?;
        let tool_specs: Vec<ToolSpec> = self
            .tools
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                common::check_tool_name(&t.function.name, &format!("tools[{i}].function.name"))?;
                Ok(ToolSpec {
                    name: t.function.name,
                    description: t.function.description,
                    parameters: t.function.parameters,
                    strict: t.function.strict,
                    defer_loading: false,
                })
            })
            .collect::<Result<_>>()?;
        let image_token = options.special_tokens.token(SpecialToken::Image);
        let vision = version == ModelVersion::DeepseekV41Flash;
        let mut messages = convert_messages(self.messages, image_token, vision)?;

        let has_response_format = self.response_format.is_some();
        let format_spec = match self.response_format {
            None | Some(ChatCompletionResponseFormat::Text) => FormatSpec::Text,
            Some(ChatCompletionResponseFormat::JsonObject) => FormatSpec::JsonObject,
            Some(ChatCompletionResponseFormat::JsonSchema { json_schema }) => {
                FormatSpec::JsonSchema {
                    schema: json_schema.schema,
                    strict: json_schema.strict == Some(true),
                }
            }
            Some(ChatCompletionResponseFormat::Regex { regex }) => FormatSpec::Regex(regex),
        };
        if matches!(format_spec, FormatSpec::JsonObject) && !common::mentions_json(&messages) {
            return Err(bad(
                "Prompt must contain the word 'json' in some form to use 'response_format' of type 'json_object'.",
            ));
        }
        let choice = match self.tool_choice {
            None | Some(ChatToolChoice::Auto) => ChoiceSpec::Auto,
            Some(ChatToolChoice::None) => ChoiceSpec::None,
            Some(ChatToolChoice::Required) => ChoiceSpec::Required,
            Some(ChatToolChoice::Function(name)) => ChoiceSpec::Named(name),
        };
        let switch = self.thinking.map(|t| t.kind != ThinkingType::Disabled);
        let (thinking, effort) =
            common::resolve_thinking(switch, self.reasoning_effort.map(Effort::from), options);
        let declared = !tool_specs.is_empty();
        // Declared tools count, even when `tool_choice: none` drops them.
        common::apply_reasoning_policy(
            &mut messages,
            thinking,
            declared,
            options,
            "reasoning_content",
        )?;
        let mut tools = common::finalize_tools(tool_specs, &choice)?;
        let (format, format_constraint) = common::finalize_format(format_spec)?;

        let tool_choice = common::resolve_tool_choice(choice, &mut tools, thinking)?;
        common::check_prefix_rules(declared, &messages, &format)?;

        let stop = match self.stop {
            None => Vec::new(),
            Some(StringOrList::One(s)) => {
                common::check_stop(std::slice::from_ref(&s), true, "stop")?;
                vec![s]
            }
            Some(StringOrList::Many(v)) => {
                common::check_stop(&v, false, "stop")?;
                v
            }
        };
        let stream = self.stream.unwrap_or(false);
        let include_usage = self
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(bad("stream_options should be set along with stream = true"));
        }
        common::check_strict_rules(&tools, has_response_format)?;
        if self.n.is_some_and(|n| n != 1) {
            return Err(bad("Invalid n value (currently only n = 1 is supported)"));
        }
        check_penalty("presence_penalty", self.presence_penalty)?;
        check_penalty("frequency_penalty", self.frequency_penalty)?;
        common::check_temperature(self.temperature)?;
        common::check_top_p(self.top_p)?;
        let logprobs = self.logprobs.unwrap_or(false);
        common::check_top_logprobs(self.top_logprobs, logprobs)?;
        // Both limits are checked; OpenAI's current name wins over the deprecated one.
        common::check_max_tokens(self.max_tokens, thinking, options)?;
        common::check_max_tokens(self.max_completion_tokens, thinking, options)?;
        let max_tokens = self.max_completion_tokens.or(self.max_tokens);
        if self.seed.is_some_and(|s| s >= 1 << 63) {
            return Err(bad(
                "Invalid seed value, the valid range of seed is [0, 2^63)",
            ));
        }

        Ok(common::assemble(
            Resolved {
                version,
                thinking,
                reasoning_effort: effort,
                messages,
                tools,
                tool_choice,
                format,
                format_constraint,
                stop_sequences: stop,
                max_tokens,
                temperature: self.temperature,
                top_p: self.top_p,
                logprobs,
                top_logprobs: self.top_logprobs,
                seed: self.seed,
                stream,
                output: super::OutputOptions {
                    include_usage,
                    ..Default::default()
                },
            },
            options,
        ))
    }
}

fn check_penalty(name: &str, value: Option<f32>) -> Result<()> {
    match value {
        Some(v) if !(-2.0..=2.0).contains(&v) => Err(bad(format!(
            "Invalid {name} value, the valid range of {name} is [-2, 2]"
        ))),
        _ => Ok(()),
    }
}

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
fn convert_messages(
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
