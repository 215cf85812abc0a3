//! Anthropic Messages: stream events and the message they accumulate into.

use std::sync::Arc;

use super::json;
use super::usage::Usage;

/// What `message_start` and the body repeat.
#[derive(Clone, Debug, PartialEq)]
pub struct MessageHead {
    pub id: String,
    pub model: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum BlockStart {
    Thinking,
    Text,
    ToolUse { id: String, name: String },
}

#[derive(Clone, Debug, PartialEq)]
pub enum BlockDelta {
    Thinking(String),
    Signature(String),
    Text(String),
    InputJson(String),
}

#[derive(Clone, Debug, PartialEq)]
pub enum MessagesStreamEvent {
    MessageStart {
        head: Arc<MessageHead>,
        usage: Usage,
    },
    ContentBlockStart {
        index: usize,
        block: BlockStart,
    },
    Ping,
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        stop_reason: &'static str,
        stop_sequence: Option<String>,
        usage: Usage,
    },
    MessageStop,
}

impl MessagesStreamEvent {
    pub fn event_type(&self) -> &'static str {
        match self {
            MessagesStreamEvent::MessageStart { .. } => "message_start",
            MessagesStreamEvent::ContentBlockStart { .. } => "content_block_start",
            MessagesStreamEvent::Ping => "ping",
            MessagesStreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            MessagesStreamEvent::ContentBlockStop { .. } => "content_block_stop",
            MessagesStreamEvent::MessageDelta { .. } => "message_delta",
            MessagesStreamEvent::MessageStop => "message_stop",
        }
    }

    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(128);
        out.push_str("{\"type\":\"");
        out.push_str(self.event_type());
        out.push('"');
        match self {
            MessagesStreamEvent::MessageStart { head, usage } => {
                out.push_str(",\"message\":{\"id\":");
                json::string(&mut out, &head.id);
                out.push_str(",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
                json::string(&mut out, &head.model);
                out.push_str(
                    ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":",
                );
                usage.messages_json(&mut out);
                out.push('}');
            }
            MessagesStreamEvent::ContentBlockStart { index, block } => {
                out.push_str(",\"index\":");
                json::uint(&mut out, *index as u64);
                out.push_str(",\"content_block\":");
                match block {
                    BlockStart::Thinking => {
                        out.push_str("{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}")
                    }
                    BlockStart::Text => out.push_str("{\"type\":\"text\",\"text\":\"\"}"),
                    BlockStart::ToolUse { id, name } => {
                        out.push_str("{\"type\":\"tool_use\",\"id\":");
                        json::string(&mut out, id);
                        out.push_str(",\"name\":");
                        json::string(&mut out, name);
                        out.push_str(",\"input\":{}}");
                    }
                }
            }
            MessagesStreamEvent::Ping => {}
            MessagesStreamEvent::ContentBlockDelta { index, delta } => {
                out.push_str(",\"index\":");
                json::uint(&mut out, *index as u64);
                let (kind, field, text) = match delta {
                    BlockDelta::Thinking(t) => ("thinking_delta", "thinking", t),
                    BlockDelta::Signature(t) => ("signature_delta", "signature", t),
                    BlockDelta::Text(t) => ("text_delta", "text", t),
                    BlockDelta::InputJson(t) => ("input_json_delta", "partial_json", t),
                };
                out.push_str(",\"delta\":{\"type\":\"");
                out.push_str(kind);
                out.push_str("\",\"");
                out.push_str(field);
                out.push_str("\":");
                json::string(&mut out, text);
                out.push('}');
            }
            MessagesStreamEvent::ContentBlockStop { index } => {
                out.push_str(",\"index\":");
                json::uint(&mut out, *index as u64);
            }
            MessagesStreamEvent::MessageDelta {
                stop_reason,
                stop_sequence,
                usage,
            } => {
                out.push_str(",\"delta\":{\"stop_reason\":");
                json::string(&mut out, stop_reason);
                out.push_str(",\"stop_sequence\":");
                json::opt_string(&mut out, stop_sequence.as_deref());
                out.push_str("},\"usage\":");
                usage.messages_json(&mut out);
            }
            MessagesStreamEvent::MessageStop => {}
        }
        out.push('}');
        out
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Block {
    Thinking {
        thinking: String,
        signature: String,
    },
    Text(String),
    ToolUse {
        id: String,
        name: String,
        partial_json: String,
        /// The parsed input, once the block stopped; `{}` when the JSON is invalid.
        input: Option<serde_json::Value>,
    },
}

/// The non-streaming message built from the events of one response.
#[derive(Clone, Debug, PartialEq)]
pub struct MessagesResponse {
    id: String,
    model: String,
    blocks: Vec<(usize, Block)>,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<String>,
    usage: Usage,
}

impl MessagesResponse {
    pub fn new(id: String, model: String, prompt_tokens: u64, cached_tokens: u64) -> Self {
        MessagesResponse {
            id,
            model,
            blocks: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: Usage {
                prompt_tokens,
                cached_tokens,
                completion_tokens: 0,
                reasoning_tokens: None,
            },
        }
    }

    fn block(&mut self, index: usize) -> Option<&mut Block> {
        self.blocks
            .iter_mut()
            .rev()
            .find(|(i, _)| *i == index)
            .map(|(_, b)| b)
    }

    pub fn accumulate(&mut self, event: &MessagesStreamEvent) {
        match event {
            MessagesStreamEvent::MessageStart { head, usage } => {
                self.id = head.id.clone();
                self.model = head.model.clone();
                self.usage = *usage;
            }
            MessagesStreamEvent::ContentBlockStart { index, block } => {
                let b = match block {
                    BlockStart::Thinking => Block::Thinking {
                        thinking: String::new(),
                        signature: String::new(),
                    },
                    BlockStart::Text => Block::Text(String::new()),
                    BlockStart::ToolUse { id, name } => Block::ToolUse {
                        id: id.clone(),
                        name: name.clone(),
                        partial_json: String::new(),
                        input: None,
                    },
                };
                self.blocks.push((*index, b));
            }
            MessagesStreamEvent::Ping | MessagesStreamEvent::MessageStop => {}
            MessagesStreamEvent::ContentBlockDelta { index, delta } => {
                match (self.block(*index), delta) {
                    (Some(Block::Thinking { thinking, .. }), BlockDelta::Thinking(t)) => {
                        thinking.push_str(t)
                    }
                    (Some(Block::Thinking { signature, .. }), BlockDelta::Signature(t)) => {
                        signature.push_str(t)
                    }
                    (Some(Block::Text(s)), BlockDelta::Text(t)) => s.push_str(t),
                    (Some(Block::ToolUse { partial_json, .. }), BlockDelta::InputJson(t)) => {
                        partial_json.push_str(t)
                    }
                    _ => {}
                }
            }
            MessagesStreamEvent::ContentBlockStop { index } => {
                if let Some(Block::ToolUse {
                    partial_json,
                    input,
                    ..
                }) = self.block(*index)
                {
                    *input = Some(parse_input(partial_json));
                }
            }
            MessagesStreamEvent::MessageDelta {
                stop_reason,
                stop_sequence,
                usage,
            } => {
                self.stop_reason = Some(stop_reason);
                self.stop_sequence = stop_sequence.clone();
                self.usage = *usage;
            }
        }
    }

    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(512);
        out.push_str("{\"id\":");
        json::string(&mut out, &self.id);
        out.push_str(",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        json::string(&mut out, &self.model);
        out.push_str(",\"content\":[");
        for (k, (_, b)) in self.blocks.iter().enumerate() {
            if k > 0 {
                out.push(',');
            }
            match b {
                Block::Thinking {
                    thinking,
                    signature,
                } => {
                    out.push_str("{\"type\":\"thinking\",\"thinking\":");
                    json::string(&mut out, thinking);
                    out.push_str(",\"signature\":");
                    json::string(&mut out, signature);
                    out.push('}');
                }
                Block::Text(t) => {
                    out.push_str("{\"type\":\"text\",\"text\":");
                    json::string(&mut out, t);
                    out.push('}');
                }
                Block::ToolUse {
                    id, name, input, ..
                } => {
                    out.push_str("{\"type\":\"tool_use\",\"id\":");
                    json::string(&mut out, id);
                    out.push_str(",\"name\":");
                    json::string(&mut out, name);
                    out.push_str(",\"input\":");
                    match input {
                        Some(v) => json::value(&mut out, v),
                        None => out.push_str("{}"),
                    }
                    out.push('}');
                }
            }
        }
        out.push_str("],\"stop_reason\":");
        json::opt_string(&mut out, self.stop_reason);
        out.push_str(",\"stop_sequence\":");
        json::opt_string(&mut out, self.stop_sequence.as_deref());
        out.push_str(",\"usage\":");
        self.usage.messages_json(&mut out);
        out.push('}');
        out
    }
}

/// Tool input as the body reports it: the arguments parsed as JSON, `{}` when they are not valid.
fn parse_input(partial_json: &str) -> serde_json::Value {
    match serde_json::from_str::<serde_json::Value>(partial_json) {
        Ok(v) => v,
        Err(_) => serde_json::Value::Object(serde_json::Map::new()),
    }
}
