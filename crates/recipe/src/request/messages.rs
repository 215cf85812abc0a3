//! Anthropic Messages requests.
//!
//! The wire types mirror deepseek-recipe's, so a malformed body gets the same serde message.
//! Conversion walks the messages in order, keeping the `tool_use` ids of the last assistant
//! message until `tool_result` blocks answer them, and reports a problem at the first block that
//! shows it, with the official's paths (`messages.2.content.0`).

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::common::{self, bad, ChoiceSpec, Effort, Resolved, Result, ToolSpec};
use super::images;
use super::options::{ConversionOptions, WebSearchBehavior};
use super::responses::ResponsesEffort;
use super::ConversationRequest;
use crate::conversation::{
    ImageData, ImageDetail, ImageSource, Message, ResponseFormat, Role, ToolCall, ToolDefinition,
};
use crate::error::{ConversionError, RecipeError};
use crate::pyjson::{self, NumberStyle};
use crate::render::ModelVersion;
use crate::special::SpecialToken;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "MessagesRequest")]
pub struct MessagesRequest {
    pub model: String,
    pub messages: Vec<MessagesMessage>,
    pub max_tokens: Option<u32>,
    pub system: Option<SystemPrompt>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub thinking: Option<MessagesThinking>,
    pub output_config: Option<MessagesOutputConfig>,
    pub tool_choice: Option<MessagesToolChoice>,
    pub tools: Option<Vec<MessagesTool>>,
    /// Accepted and not used; read so a malformed one is refused as the official refuses it.
    pub metadata: Option<MessagesMetadata>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct MessagesMetadata {
    pub user_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(
    rename = "MessagesMessage",
    tag = "role",
    content = "content",
    rename_all = "lowercase"
)]
pub enum MessagesMessage {
    User(MessageContent),
    Assistant(MessageContent),
    System(MessageContent),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageRole {
    User,
    Assistant,
    System,
}

impl MessagesMessage {
    pub fn role(&self) -> MessageRole {
        match self {
            MessagesMessage::User(_) => MessageRole::User,
            MessagesMessage::Assistant(_) => MessageRole::Assistant,
            MessagesMessage::System(_) => MessageRole::System,
        }
    }

    pub fn content(&self) -> &MessageContent {
        match self {
            MessagesMessage::User(c)
            | MessagesMessage::Assistant(c)
            | MessagesMessage::System(c) => c,
        }
    }
}

/// A string or a list of `T`.
#[derive(Debug, Clone)]
pub enum TextOrList<T> {
    Text(String),
    List(Vec<T>),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for TextOrList<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        const EXPECTED: &str = "expected a string or a list";
        fn other<E: serde::de::Error, R>() -> std::result::Result<R, E> {
            Err(E::custom(EXPECTED))
        }
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
            type Value = TextOrList<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a list")
            }
            fn visit_str<E: serde::de::Error>(
                self,
                s: &str,
            ) -> std::result::Result<Self::Value, E> {
                Ok(TextOrList::Text(s.to_string()))
            }
            fn visit_string<E: serde::de::Error>(
                self,
                s: String,
            ) -> std::result::Result<Self::Value, E> {
                Ok(TextOrList::Text(s))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(TextOrList::List(items))
            }
            fn visit_bool<E: serde::de::Error>(
                self,
                _: bool,
            ) -> std::result::Result<Self::Value, E> {
                other()
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> std::result::Result<Self::Value, E> {
                other()
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> std::result::Result<Self::Value, E> {
                other()
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> std::result::Result<Self::Value, E> {
                other()
            }
            fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<Self::Value, E> {
                other()
            }
            fn visit_none<E: serde::de::Error>(self) -> std::result::Result<Self::Value, E> {
                other()
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                _: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                other()
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

pub type MessageContent = TextOrList<MessagesContentBlock>;
pub type SystemPrompt = TextOrList<MessagesSystemBlock>;

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagesSystemBlock {
    Text { text: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagesContentBlock {
    Text {
        text: String,
    },
    Image {
        source: MessagesImageSource,
    },
    Document {
        source: MessagesDocumentSource,
    },
    Thinking {
        thinking: String,
        /// Checked to be a string (as the official does) and not used.
        #[allow(dead_code)]
        signature: Option<String>,
    },
    ServerToolUse {
        #[allow(dead_code)]
        id: String,
        #[allow(dead_code)]
        name: String,
        #[allow(dead_code)]
        input: Value,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        content: Option<TextOrList<ToolResultBlock>>,
        /// Accepted and not used.
        #[allow(dead_code)]
        is_error: Option<bool>,
    },
    WebSearchToolResult {
        #[allow(dead_code)]
        tool_use_id: String,
        #[allow(dead_code)]
        content: Value,
    },
    ToolAddition {
        tool: MessagesToolReference,
    },
}

/// A block of a tool result's content, read through a JSON value as the official reads it: there
/// an integer `type` is refused ("expected variant identifier"), where serde's buffered
/// tagged-enum path would take it as a variant index.
#[derive(Debug, Clone)]
pub struct ToolResultBlock(pub MessagesToolResultBlock);

impl<'de> Deserialize<'de> for ToolResultBlock {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        MessagesToolResultBlock::deserialize(value)
            .map(ToolResultBlock)
            .map_err(D::Error::custom)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagesToolResultBlock {
    Text { text: String },
    Image { source: MessagesImageSource },
    Document { source: MessagesDocumentSource },
    ToolReference { tool_name: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagesToolReference {
    ToolReference { name: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagesImageSource {
    Base64 {
        media_type: ImageMediaType,
        data: String,
    },
    Url {
        url: String,
    },
    File {},
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub enum ImageMediaType {
    #[serde(rename = "image/jpeg")]
    Jpeg,
    #[serde(rename = "image/jpg")]
    Jpg,
    #[serde(rename = "image/png")]
    Png,
    #[serde(rename = "image/gif")]
    Gif,
    #[serde(rename = "image/webp")]
    Webp,
}

impl ImageMediaType {
    fn as_str(self) -> &'static str {
        match self {
            ImageMediaType::Jpeg => "image/jpeg",
            ImageMediaType::Jpg => "image/jpg",
            ImageMediaType::Png => "image/png",
            ImageMediaType::Gif => "image/gif",
            ImageMediaType::Webp => "image/webp",
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub struct MessagesThinking {
    #[serde(rename = "type")]
    pub kind: ThinkingKind,
    /// Accepted and not used (effort comes from `output_config`).
    pub budget_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThinkingKind {
    Adaptive,
    Enabled,
    Disabled,
}

#[derive(Debug, Clone, Deserialize)]
pub struct MessagesOutputConfig {
    pub effort: Option<ResponsesEffort>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct MessagesDocumentSource {
    pub media_type: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagesToolChoice {
    Auto {
        disable_parallel_tool_use: Option<bool>,
    },
    Any {
        disable_parallel_tool_use: Option<bool>,
    },
    Tool {
        name: String,
        disable_parallel_tool_use: Option<bool>,
    },
    None {},
}

/// A declared tool: a client tool (no `type`) or a server tool (any `type`).
#[derive(Debug, Clone)]
pub enum MessagesTool {
    Client(ClientTool),
    Server(String),
}

#[derive(Debug, Clone)]
pub struct ClientTool {
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Option<Value>,
    pub defer_loading: Option<bool>,
}

impl<'de> Deserialize<'de> for MessagesTool {
    /// deepseek-recipe reads a tool field by field: a `type` (any string) makes it a server tool;
    /// otherwise the client fields are read in document order, errors naming the field.
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        fn field<T: for<'a> Deserialize<'a>, E: serde::de::Error>(
            name: &str,
            v: &Value,
        ) -> std::result::Result<T, E> {
            T::deserialize(v).map_err(|e| E::custom(format!("field `{name}`: {e}")))
        }
        let value = Value::deserialize(d)?;
        let Value::Object(map) = value else {
            return Err(D::Error::missing_field("name"));
        };
        if let Some(kind) = map.get("type") {
            let kind = String::deserialize(kind).map_err(D::Error::custom)?;
            // A server tool's `name`, when given, must be a string (the official reads it).
            if let Some(name) = map.get("name") {
                Option::<String>::deserialize(name).map_err(D::Error::custom)?;
            }
            return Ok(MessagesTool::Server(kind));
        }
        let mut name = None;
        let mut tool = ClientTool {
            name: String::new(),
            description: None,
            input_schema: None,
            defer_loading: None,
        };
        for (key, v) in &map {
            match key.as_str() {
                "name" => name = Some(field::<String, D::Error>("name", v)?),
                "description" => tool.description = field::<_, D::Error>("description", v)?,
                "input_schema" => {
                    tool.input_schema = (!v.is_null()).then(|| v.clone());
                }
                "defer_loading" => tool.defer_loading = field::<_, D::Error>("defer_loading", v)?,
                _ => {}
            }
        }
        tool.name = name.ok_or_else(|| D::Error::missing_field("name"))?;
        Ok(MessagesTool::Client(tool))
    }
}

// ---------------------------------------------------------------------------------------------
// Conversion

const PENDING_TAIL: &str =
    "Each `tool_use` block must have a corresponding `tool_result` block in the next message.";

/// The ids are listed sorted, as the official keeps them in an ordered set.
fn unanswered(path: &str, sep: &str, ids: &[String]) -> ConversionError {
    let mut ids = ids.to_vec();
    ids.sort();
    ids.dedup();
    bad(format!(
        "{path}:{sep}`tool_use` ids were found without `tool_result` blocks immediately after: {}. {PENDING_TAIL}",
        ids.join(", ")
    ))
}

/// Where conversion is while it walks the messages.
struct Walk<'a> {
    version: ModelVersion,
    image_token: &'a str,
    out: Vec<Message>,
    /// `tool_use` ids of the last assistant message not answered yet, and its index.
    pending: Vec<String>,
    pending_at: usize,
    /// Tool names each system message adds, by output message index.
    additions: Vec<(usize, Vec<String>)>,
    /// Names of the declared tools.
    declared: Vec<String>,
}

impl MessagesRequest {
    pub fn from_body(body: super::RequestBody<'_>) -> std::result::Result<Self, RecipeError> {
        super::parse_body(body)
    }

    /// [`Self::from_body`], boxed (see [`super::parse_body_boxed`]).
    pub fn from_body_boxed(
        body: super::RequestBody<'_>,
    ) -> std::result::Result<Box<Self>, RecipeError> {
        super::parse_body_boxed(body)
    }

    /// Declared client tools. V4 has no deferred loading: its tools are all loaded up front.
    fn tool_specs(
        &self,
        options: &ConversionOptions,
        version: ModelVersion,
    ) -> Result<Vec<ToolSpec>> {
        let mut out = Vec::new();
        for (i, tool) in self.tools.iter().flatten().enumerate() {
            match tool {
                MessagesTool::Server(kind) => {
                    let web_search = kind.starts_with("web_search");
                    if web_search && options.messages_web_search == WebSearchBehavior::Drop {
                        continue;
                    }
                    return Err(bad(format!("tools[{i}]: server tools are not supported")));
                }
                MessagesTool::Client(t) => {
                    common::check_tool_name(&t.name, &format!("tools[{i}].name"))?;
                    out.push(ToolSpec {
                        name: t.name.clone(),
                        description: t.description.clone(),
                        parameters: Some(t.input_schema.clone().unwrap_or(Value::Null)),
                        strict: None,
                        defer_loading: version == ModelVersion::DeepseekV41Flash
                            && t.defer_loading.unwrap_or(false),
                    });
                }
            }
        }
        Ok(out)
    }

    pub fn convert(
        self,
        options: &ConversionOptions,
    ) -> std::result::Result<ConversationRequest, ConversionError> {
        let version = common::resolve_model(options, &self.model)?;
        let tool_specs = self.tool_specs(options, version)?;
        if !tool_specs.is_empty() && tool_specs.iter().all(|t| t.defer_loading) {
            return Err(bad(
                "tools: at least one tool must have defer_loading=false. All tools cannot be deferred.",
            ));
        }
        if self.messages.is_empty() {
            return Err(bad("messages: at least one message is required"));
        }
        let image_token = options.special_tokens.token(SpecialToken::Image);
        let mut walk = Walk {
            version,
            image_token,
            out: Vec::new(),
            pending: Vec::new(),
            pending_at: 0,
            additions: Vec::new(),
            declared: tool_specs.iter().map(|t| t.name.clone()).collect(),
        };
        match &self.system {
            None => {}
            Some(TextOrList::Text(s)) => walk.out.push(plain(Role::System, s.clone())),
            Some(TextOrList::List(blocks)) => {
                let texts: Vec<&str> = blocks
                    .iter()
                    .map(|MessagesSystemBlock::Text { text }| text.as_str())
                    .collect();
                walk.out.push(plain(Role::System, texts.join("\n\n")));
            }
        }
        for (i, message) in self.messages.iter().enumerate() {
            walk.message(i, message)?;
        }
        if !walk.pending.is_empty() {
            return Err(unanswered(
                &format!("messages.{}", walk.pending_at),
                "",
                &walk.pending,
            ));
        }
        let Walk {
            out: mut messages,
            additions,
            ..
        } = walk;

        let choice = match &self.tool_choice {
            None | Some(MessagesToolChoice::Auto { .. }) | Some(MessagesToolChoice::Any { .. }) => {
                ChoiceSpec::Auto
            }
            Some(MessagesToolChoice::None {}) => ChoiceSpec::None,
            Some(MessagesToolChoice::Tool { name, .. }) => ChoiceSpec::Named(name.clone()),
        };
        let declared = !tool_specs.is_empty();
        let switch = self.thinking.map(|t| t.kind != ThinkingKind::Disabled);
        let effort = self
            .output_config
            .as_ref()
            .and_then(|c| c.effort)
            .map(Effort::from);
        let (thinking, reasoning_effort) = common::resolve_thinking(switch, effort, options);
        common::apply_reasoning_policy(
            &mut messages,
            thinking,
            declared,
            options,
            "content[].thinking",
        )?;
        let mut tools = common::finalize_tools(tool_specs, &choice)?;
        let tool_choice = common::resolve_tool_choice(choice, &mut tools, thinking)?;
        attach_additions(&mut messages, &additions, &tools);

        let stop = self.stop_sequences.clone().unwrap_or_default();
        common::check_stop(&stop, false, "stop")?;
        common::check_temperature(self.temperature)?;
        common::check_top_p(self.top_p)?;
        let bound = if thinking {
            options.thinking_max_tokens_upper_bound
        } else {
            options.non_thinking_max_tokens_upper_bound
        };
        let max_tokens = self.max_tokens.map(|m| m.min(bound));
        common::check_max_tokens(max_tokens, thinking, options)?;

        Ok(common::assemble(
            Resolved {
                version,
                thinking,
                reasoning_effort,
                messages,
                tools,
                tool_choice,
                format: ResponseFormat::Text,
                format_constraint: None,
                stop_sequences: stop,
                max_tokens,
                temperature: self.temperature,
                top_p: self.top_p,
                logprobs: false,
                top_logprobs: None,
                seed: None,
                stream: self.stream.unwrap_or(false),
                output: super::OutputOptions::default(),
            },
            options,
        ))
    }
}

/// Give each system message the (final) definitions of the tools its `tool_addition` blocks
/// name. A system message that was only there to add tools, none of which remain (`tool_choice`
/// dropped them), is removed.
fn attach_additions(
    messages: &mut Vec<Message>,
    additions: &[(usize, Vec<String>)],
    tools: &[ToolDefinition],
) {
    for (at, names) in additions.iter().rev() {
        let defs: Vec<ToolDefinition> = names
            .iter()
            .filter_map(|n| tools.iter().find(|t| &t.name == n).cloned())
            .collect();
        let Some(m) = messages.get_mut(*at) else {
            continue;
        };
        if defs.is_empty() && m.content.is_empty() && m.image_sources.is_empty() {
            messages.remove(*at);
        } else {
            m.tools = Some(defs);
        }
    }
}

impl Walk<'_> {
    fn message(&mut self, i: usize, message: &MessagesMessage) -> Result<()> {
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
            return Ok(("[Unsupported Image]".to_string(), Vec::new()));
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

fn plain(role: Role, content: String) -> Message {
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
