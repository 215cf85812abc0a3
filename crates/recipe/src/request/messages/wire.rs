//! Anthropic Messages wire types. They mirror deepseek-recipe's, so a malformed body gets the
//! same serde message.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::request::responses::ResponsesEffort;

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
    pub(super) fn as_str(self) -> &'static str {
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
