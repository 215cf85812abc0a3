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
        let served = &e.served;
        out.push_str(",\"content_filters\":null,\"error\":null,\"frequency_penalty\":");
        json::float(out, served.frequency_penalty);
        out.push_str(",\"incomplete_details\":");
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
        out.push_str(",\"max_tool_calls\":");
        json::opt_uint(out, served.max_tool_calls);
        out.push_str(",\"model\":");
        json::string(out, &self.model);
        out.push_str(",\"moderation\":null,\"output\":[");
        for (i, item) in self.output.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            item.write(out, &self.id, true);
        }
        out.push_str("],\"parallel_tool_calls\":");
        out.push_str(if served.parallel_tool_calls {
            "true"
        } else {
            "false"
        });
        out.push_str(",\"presence_penalty\":");
        json::float(out, served.presence_penalty);
        out.push_str(",\"previous_response_id\":null,\"prompt_cache_key\":");
        json::opt_string(out, served.prompt_cache_key.as_deref());
        out.push_str(",\"prompt_cache_retention\":null,\"reasoning\":");
        json::value(out, &e.reasoning);
        out.push_str(",\"safety_identifier\":");
        json::opt_string(out, served.safety_identifier.as_deref());
        out.push_str(",\"service_tier\":\"default\",\"store\":false,\"temperature\":");
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
        out.push_str(",\"metadata\":");
        json::value(out, &served.metadata);
        out.push('}');
    }
}

fn float32(out: &mut String, v: f32) {
    match serde_json::to_string(&v) {
        Ok(s) => out.push_str(&s),
        Err(_) => out.push_str("null"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{json, Value};

    use super::{ResponseObject, ResponseStatus};
    use crate::response::{ResponsesEcho, ServedSettings};

    fn written(echo: ResponsesEcho) -> Value {
        let object = ResponseObject {
            id: "resp_1".into(),
            model: "m".into(),
            created_at: 1,
            status: ResponseStatus::Completed,
            completed_at: Some(2),
            incomplete_reason: None,
            echo: Arc::new(echo),
            output: Vec::new(),
            usage: None,
        };
        let mut out = String::new();
        object.write(&mut out);
        serde_json::from_str(&out).expect("the object is JSON")
    }

    #[test]
    fn defaults_say_what_an_unspecified_request_gets() {
        let o = written(ResponsesEcho::default());
        assert_eq!(
            o["text"],
            json!({"format": {"type": "text"}, "verbosity": "medium"})
        );
        assert_eq!(o["parallel_tool_calls"], json!(true));
        assert_eq!(o["max_tool_calls"], Value::Null);
        assert_eq!(o["metadata"], json!({}));
        assert_eq!(o["frequency_penalty"].to_string(), "0.0");
        assert_eq!(o["presence_penalty"].to_string(), "0.0");
        assert_eq!(o["prompt_cache_key"], Value::Null);
        assert_eq!(o["safety_identifier"], Value::Null);
    }

    #[test]
    fn served_settings_are_reported() {
        let echo = ResponsesEcho {
            served: ServedSettings {
                parallel_tool_calls: false,
                max_tool_calls: Some(3),
                metadata: json!({"k": "v"}),
                prompt_cache_key: Some("key".into()),
                safety_identifier: Some("u1".into()),
                presence_penalty: 0.5,
                frequency_penalty: -1.0,
            },
            ..ResponsesEcho::default()
        };
        let o = written(echo);
        assert_eq!(o["parallel_tool_calls"], json!(false));
        assert_eq!(o["max_tool_calls"], json!(3));
        assert_eq!(o["metadata"], json!({"k": "v"}));
        assert_eq!(o["prompt_cache_key"], json!("key"));
        assert_eq!(o["safety_identifier"], json!("u1"));
        assert_eq!(o["presence_penalty"], json!(0.5));
        assert_eq!(o["frequency_penalty"].to_string(), "-1.0");
    }
}
