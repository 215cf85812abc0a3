//! Chat Completions: streamed chunks and the non-streaming body they accumulate into.

use std::sync::Arc;

use super::json;
use super::usage::Usage;
use crate::stream::TokenLogprobs;

/// What every chunk of one response repeats.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatHead {
    pub id: String,
    pub model: String,
    pub created: u64,
    pub system_fingerprint: Option<String>,
    /// Whether chunks without usage say `"usage":null` (omitted when streaming without
    /// `stream_options.include_usage`, as OpenAI does).
    pub usage_null: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ChatDelta {
    /// The first chunk. `thinking`: the response has a reasoning field; `continuation`: it
    /// continues the content of a prefix (`reasoning_content` is null, content is "").
    Role {
        thinking: bool,
        continuation: bool,
    },
    Reasoning(String),
    Content {
        text: String,
        thinking: bool,
    },
    ToolStart {
        index: usize,
        id: String,
        name: String,
    },
    ToolArgs {
        index: usize,
        arguments: String,
    },
    /// The last chunk (with the finish reason and usage).
    Final {
        thinking: bool,
    },
}

/// Which delta field the log probabilities belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogprobField {
    Content,
    Reasoning,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ChatCompletionChunk {
    pub head: Arc<ChatHead>,
    pub delta: ChatDelta,
    pub logprobs: Option<(LogprobField, Vec<TokenLogprobs>)>,
    pub finish_reason: Option<&'static str>,
    pub usage: Option<Usage>,
}

impl ChatCompletionChunk {
    pub fn to_json(&self) -> String {
        let h = &*self.head;
        let mut out = String::with_capacity(256);
        out.push_str("{\"id\":");
        json::string(&mut out, &h.id);
        out.push_str(",\"object\":\"chat.completion.chunk\",\"created\":");
        json::uint(&mut out, h.created);
        out.push_str(",\"model\":");
        json::string(&mut out, &h.model);
        out.push_str(",\"system_fingerprint\":");
        json::opt_string(&mut out, h.system_fingerprint.as_deref());
        out.push_str(",\"choices\":[{\"index\":0,\"delta\":");
        self.delta_json(&mut out);
        out.push_str(",\"logprobs\":");
        match &self.logprobs {
            Some((field, entries)) => {
                out.push_str(match field {
                    LogprobField::Content => "{\"content\":",
                    LogprobField::Reasoning => "{\"reasoning_content\":",
                });
                json::logprobs(&mut out, entries);
                out.push('}');
            }
            None => out.push_str("null"),
        }
        out.push_str(",\"finish_reason\":");
        json::opt_string(&mut out, self.finish_reason);
        out.push_str("}]");
        match &self.usage {
            Some(u) => {
                out.push_str(",\"usage\":");
                u.chat_json(&mut out);
            }
            None if h.usage_null => out.push_str(",\"usage\":null"),
            None => {}
        }
        out.push('}');
        out
    }

    fn delta_json(&self, out: &mut String) {
        match &self.delta {
            ChatDelta::Role {
                thinking: false, ..
            } => out.push_str("{\"role\":\"assistant\",\"content\":\"\"}"),
            ChatDelta::Role {
                continuation: true, ..
            } => {
                out.push_str("{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":null}")
            }
            ChatDelta::Role { .. } => {
                out.push_str("{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"\"}")
            }
            ChatDelta::Reasoning(text) => {
                out.push_str("{\"content\":null,\"reasoning_content\":");
                json::string(out, text);
                out.push('}');
            }
            ChatDelta::Content { text, thinking } => {
                out.push_str("{\"content\":");
                json::string(out, text);
                if *thinking {
                    out.push_str(",\"reasoning_content\":null");
                }
                out.push('}');
            }
            ChatDelta::ToolStart { index, id, name } => {
                out.push_str("{\"tool_calls\":[{\"index\":");
                json::uint(out, *index as u64);
                out.push_str(",\"id\":");
                json::string(out, id);
                out.push_str(",\"type\":\"function\",\"function\":{\"name\":");
                json::string(out, name);
                out.push_str(",\"arguments\":\"\"}}]}");
            }
            ChatDelta::ToolArgs { index, arguments } => {
                out.push_str("{\"tool_calls\":[{\"index\":");
                json::uint(out, *index as u64);
                out.push_str(",\"function\":{\"arguments\":");
                json::string(out, arguments);
                out.push_str("}}]}");
            }
            ChatDelta::Final { thinking } => {
                out.push_str("{\"content\":\"\"");
                if *thinking {
                    out.push_str(",\"reasoning_content\":null");
                }
                out.push('}');
            }
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
struct AccumulatedCall {
    index: usize,
    id: String,
    name: String,
    arguments: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Choice {
    content: Option<String>,
    /// Present once a delta carried a reasoning string (a null one does not create it).
    reasoning: Option<String>,
    tool_calls: Vec<AccumulatedCall>,
    finish_reason: Option<&'static str>,
    content_logprobs: Option<Vec<TokenLogprobs>>,
    reasoning_logprobs: Option<Vec<TokenLogprobs>>,
}

/// The non-streaming body, built from the chunks of one response.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatCompletionResponse {
    id: String,
    model: String,
    created: u64,
    choice: Option<Choice>,
    usage: Option<Usage>,
    system_fingerprint: Option<String>,
}

fn append(field: &mut Option<String>, text: &str) {
    match field {
        Some(s) => s.push_str(text),
        None => *field = Some(text.to_string()),
    }
}

impl ChatCompletionResponse {
    /// `prompt_tokens` / `prompt_cache_hit_tokens` are accepted for the official signature; the
    /// body reports the usage of the final chunk.
    pub fn new(id: String, model: String, created: u64) -> Self {
        ChatCompletionResponse {
            id,
            model,
            created,
            choice: None,
            usage: None,
            system_fingerprint: None,
        }
    }

    pub fn accumulate(&mut self, chunk: &ChatCompletionChunk) {
        if chunk.head.system_fingerprint.is_some() {
            self.system_fingerprint = chunk.head.system_fingerprint.clone();
        }
        let c = self.choice.get_or_insert_with(Choice::default);
        match &chunk.delta {
            ChatDelta::Role {
                thinking,
                continuation,
            } => {
                if !thinking || *continuation {
                    append(&mut c.content, "");
                } else {
                    append(&mut c.reasoning, "");
                }
            }
            ChatDelta::Reasoning(text) => append(&mut c.reasoning, text),
            ChatDelta::Content { text, .. } => append(&mut c.content, text),
            ChatDelta::ToolStart { index, id, name } => c.tool_calls.push(AccumulatedCall {
                index: *index,
                id: id.clone(),
                name: name.clone(),
                arguments: String::new(),
            }),
            ChatDelta::ToolArgs { index, arguments } => {
                if let Some(call) = c.tool_calls.iter_mut().rev().find(|t| t.index == *index) {
                    call.arguments.push_str(arguments);
                }
            }
            ChatDelta::Final { .. } => append(&mut c.content, ""),
        }
        if let Some((field, entries)) = &chunk.logprobs {
            let list = match field {
                LogprobField::Content => &mut c.content_logprobs,
                LogprobField::Reasoning => &mut c.reasoning_logprobs,
            };
            list.get_or_insert_with(Vec::new)
                .extend(entries.iter().cloned());
        }
        if chunk.finish_reason.is_some() {
            c.finish_reason = chunk.finish_reason;
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
    }

    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(512);
        out.push_str("{\"id\":");
        json::string(&mut out, &self.id);
        out.push_str(",\"object\":\"chat.completion\",\"created\":");
        json::uint(&mut out, self.created);
        out.push_str(",\"model\":");
        json::string(&mut out, &self.model);
        out.push_str(",\"choices\":[");
        if let Some(c) = &self.choice {
            out.push_str("{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
            json::opt_string(&mut out, c.content.as_deref());
            if let Some(r) = &c.reasoning {
                out.push_str(",\"reasoning_content\":");
                json::string(&mut out, r);
            }
            if !c.tool_calls.is_empty() {
                out.push_str(",\"tool_calls\":[");
                for (i, t) in c.tool_calls.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str("{\"index\":");
                    json::uint(&mut out, t.index as u64);
                    out.push_str(",\"id\":");
                    json::string(&mut out, &t.id);
                    out.push_str(",\"type\":\"function\",\"function\":{\"name\":");
                    json::string(&mut out, &t.name);
                    out.push_str(",\"arguments\":");
                    json::string(&mut out, &t.arguments);
                    out.push_str("}}");
                }
                out.push(']');
            }
            out.push_str("},\"logprobs\":");
            if c.content_logprobs.is_none() && c.reasoning_logprobs.is_none() {
                out.push_str("null");
            } else {
                out.push('{');
                if let Some(l) = &c.content_logprobs {
                    out.push_str("\"content\":");
                    json::logprobs(&mut out, l);
                }
                if let Some(l) = &c.reasoning_logprobs {
                    if c.content_logprobs.is_some() {
                        out.push(',');
                    }
                    out.push_str("\"reasoning_content\":");
                    json::logprobs(&mut out, l);
                }
                out.push('}');
            }
            out.push_str(",\"finish_reason\":");
            json::opt_string(&mut out, c.finish_reason);
            out.push('}');
        }
        out.push(']');
        if let Some(u) = &self.usage {
            out.push_str(",\"usage\":");
            u.chat_json(&mut out);
        }
        out.push_str(",\"system_fingerprint\":");
        json::opt_string(&mut out, self.system_fingerprint.as_deref());
        out.push('}');
        out
    }
}
