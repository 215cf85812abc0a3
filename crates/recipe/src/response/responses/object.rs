//! The response object.

use std::sync::Arc;

use super::echo::ResponsesEcho;
use super::items::OutputItem;
use crate::response::json;
use crate::response::usage::Usage;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseStatus {
    InProgress,
    Completed,
    Incomplete,
}

/// The response object of created / in_progress / completed / incomplete events and of the
/// non-streaming body.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponseObject {
    pub id: String,
    pub model: String,
    pub created_at: u64,
    pub status: ResponseStatus,
    pub completed_at: Option<u64>,
    /// `max_output_tokens` or `content_filter` for an incomplete response.
    pub incomplete_reason: Option<&'static str>,
    pub echo: Arc<ResponsesEcho>,
    pub output: Vec<OutputItem>,
    pub usage: Option<Usage>,
}

impl ResponseObject {
    pub fn write(&self, out: &mut String) {
        let e = &*self.echo;
        out.push_str("{\"id\":");
        json::string(out, &self.id);
        out.push_str(",\"object\":\"response\",\"created_at\":");
        json::uint(out, self.created_at);
        out.push_str(",\"status\":");
        out.push_str(match self.status {
            ResponseStatus::InProgress => "\"in_progress\"",
            ResponseStatus::Completed => "\"completed\"",
            ResponseStatus::Incomplete => "\"incomplete\"",
        });
        out.push_str(",\"background\":false,\"completed_at\":");
        json::opt_uint(out, self.completed_at);
        out.push_str(
            ",\"content_filters\":null,\"error\":null,\"frequency_penalty\":0.0,\"incomplete_details\":",
        );
        match self.incomplete_reason {
            Some(r) => {
                out.push_str("{\"reason\":");
                json::string(out, r);
                out.push('}');
            }
            None => out.push_str("null"),
        }
        out.push_str(",\"instructions\":");
        json::opt_string(out, e.instructions.as_deref());
        out.push_str(",\"max_output_tokens\":");
        json::opt_uint(out, e.max_output_tokens);
        out.push_str(",\"max_tool_calls\":null,\"model\":");
        json::string(out, &self.model);
        out.push_str(",\"moderation\":null,\"output\":[");
        for (i, item) in self.output.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            item.write(out, &self.id, true);
        }
        out.push_str(
            "],\"parallel_tool_calls\":true,\"presence_penalty\":0.0,\"previous_response_id\":null,\
             \"prompt_cache_key\":null,\"prompt_cache_retention\":null,\"reasoning\":",
        );
        json::value(out, &e.reasoning);
        out.push_str(
            ",\"safety_identifier\":null,\"service_tier\":\"default\",\"store\":false,\"temperature\":",
        );
        float32(out, e.temperature);
        out.push_str(",\"text\":");
        json::value(out, &e.text);
        out.push_str(",\"tool_choice\":");
        json::value(out, &e.tool_choice);
        out.push_str(",\"tools\":");
        json::value(out, &e.tools);
        out.push_str(",\"top_logprobs\":");
        json::uint(out, e.top_logprobs);
        out.push_str(",\"top_p\":");
        float32(out, e.top_p);
        out.push_str(",\"truncation\":\"disabled\",\"usage\":");
        match &self.usage {
            Some(u) => u.responses_json(out),
            None => out.push_str("null"),
        }
        out.push_str(",\"user\":");
        json::opt_string(out, e.user.as_deref());
        out.push_str(",\"metadata\":{}}");
    }
}

fn float32(out: &mut String, v: f32) {
    match serde_json::to_string(&v) {
        Ok(s) => out.push_str(&s),
        Err(_) => out.push_str("null"),
    }
}
