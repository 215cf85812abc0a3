//! Output items: reasoning, messages, function and custom tool calls.

use crate::response::json;
use crate::stream::TokenLogprobs;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemStatus {
    InProgress,
    Completed,
    Incomplete,
}

impl ItemStatus {
    fn as_str(self) -> &'static str {
        match self {
            ItemStatus::InProgress => "in_progress",
            ItemStatus::Completed => "completed",
            ItemStatus::Incomplete => "incomplete",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ItemBody {
    Reasoning {
        text: String,
    },
    Message {
        text: String,
        logprobs: Vec<TokenLogprobs>,
        /// `final_answer`, or `commentary` once a tool call followed it.
        commentary: bool,
    },
    FunctionCall {
        call_id: String,
        name: String,
        namespace: Option<String>,
        arguments: String,
    },
    CustomToolCall {
        call_id: String,
        name: String,
        input: String,
    },
}

/// One output item. `added` items are written with empty content (as `output_item.added` shows
/// them).
#[derive(Clone, Debug, PartialEq)]
pub struct OutputItem {
    pub index: usize,
    pub status: ItemStatus,
    pub body: ItemBody,
}

impl OutputItem {
    pub(super) fn write_id(&self, out: &mut String, response_id: &str) {
        json::string(out, &self.item_id(response_id));
    }

    /// `<kind prefix><response id>_<index>`.
    pub fn item_id(&self, response_id: &str) -> String {
        let prefix = match self.body {
            ItemBody::Reasoning { .. } => "rs_",
            ItemBody::Message { .. } => "msg_",
            ItemBody::FunctionCall { .. } => "fc_",
            ItemBody::CustomToolCall { .. } => "ctc_",
        };
        let mut id = String::with_capacity(prefix.len() + response_id.len() + 4);
        id.push_str(prefix);
        id.push_str(response_id);
        id.push('_');
        id.push_str(&self.index.to_string());
        id
    }

    /// `full`: with content (false for `output_item.added`).
    pub fn write(&self, out: &mut String, response_id: &str, full: bool) {
        let status = self.status.as_str();
        match &self.body {
            ItemBody::Reasoning { text } => {
                out.push_str("{\"type\":\"reasoning\",\"id\":");
                self.write_id(out, response_id);
                out.push_str(",\"status\":\"");
                out.push_str(status);
                out.push_str("\",\"content\":[");
                if full {
                    reasoning_part(out, text);
                }
                out.push_str("],\"summary\":[],\"encrypted_content\":");
                json::string(out, &format!("{response_id}-{}", self.index));
                out.push('}');
            }
            ItemBody::Message {
                text,
                logprobs,
                commentary,
            } => {
                out.push_str("{\"type\":\"message\",\"id\":");
                self.write_id(out, response_id);
                out.push_str(",\"status\":\"");
                out.push_str(status);
                out.push_str("\",\"role\":\"assistant\",\"phase\":");
                out.push_str(if *commentary {
                    "\"commentary\""
                } else {
                    "\"final_answer\""
                });
                out.push_str(",\"content\":[");
                if full {
                    text_part(out, text, logprobs);
                }
                out.push_str("]}");
            }
            ItemBody::FunctionCall {
                call_id,
                name,
                namespace,
                arguments,
            } => {
                out.push_str("{\"type\":\"function_call\",\"id\":");
                self.write_id(out, response_id);
                out.push_str(",\"status\":\"");
                out.push_str(status);
                out.push_str("\",\"call_id\":");
                json::string(out, call_id);
                out.push_str(",\"name\":");
                json::string(out, name);
                if let Some(ns) = namespace {
                    out.push_str(",\"namespace\":");
                    json::string(out, ns);
                }
                out.push_str(",\"arguments\":");
                json::string(out, if full { arguments } else { "" });
                out.push('}');
            }
            ItemBody::CustomToolCall {
                call_id,
                name,
                input,
            } => {
                out.push_str("{\"type\":\"custom_tool_call\",\"id\":");
                self.write_id(out, response_id);
                out.push_str(",\"status\":\"");
                out.push_str(status);
                out.push_str("\",\"call_id\":");
                json::string(out, call_id);
                out.push_str(",\"name\":");
                json::string(out, name);
                out.push_str(",\"input\":");
                json::string(out, if full { input } else { "" });
                out.push('}');
            }
        }
    }
}

pub(super) fn reasoning_part(out: &mut String, text: &str) {
    out.push_str("{\"type\":\"reasoning_text\",\"text\":");
    json::string(out, text);
    out.push('}');
}

pub(super) fn text_part(out: &mut String, text: &str, logprobs: &[TokenLogprobs]) {
    out.push_str("{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":");
    json::logprobs(out, logprobs);
    out.push_str(",\"text\":");
    json::string(out, text);
    out.push('}');
}
