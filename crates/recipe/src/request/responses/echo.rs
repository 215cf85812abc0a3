//! What a Responses response object reports of its request ("echo").
//!
//! The official library echoes the request as it parsed it, not as it was sent: every declared
//! field of a tool, tool choice or text format is written (absent ones as `null`), unknown fields
//! and unknown tool kinds are dropped, and keys follow the declaration order.

use serde_json::{json, Value};

use super::wire::{
    ReasoningSummary, ResponsesEffort, ResponsesFunctionTool, ResponsesNamespaceTool,
    ResponsesRequest, ResponsesTextFormat, ResponsesTool, ResponsesToolChoice,
    ResponsesWebSearchTool, ToolChoiceObject, Verbosity,
};
use crate::response::{ResponsesEcho, ServedSettings};

impl ResponsesRequest {
    /// What the response object echoes of this request.
    pub fn echo(&self) -> ResponsesEcho {
        let reasoning = self.reasoning.as_ref();
        let text = self.text.as_ref();
        ResponsesEcho {
            instructions: self.instructions.clone(),
            max_output_tokens: self.max_output_tokens.map(u64::from),
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0),
            top_logprobs: u64::from(self.top_logprobs.unwrap_or(0)),
            user: self.user.clone(),
            reasoning: json!({
                "effort": reasoning.and_then(|r| r.effort).map(ResponsesEffort::as_str),
                "summary": reasoning.and_then(|r| r.summary).map(ReasoningSummary::as_str),
            }),
            text: json!({
                "format": text.map_or_else(|| json!({"type": "text"}), |t| text_format(&t.format)),
                // OpenAI's default when not given; the official writes null (DEVIATIONS.md R5).
                "verbosity": text.and_then(|t| t.verbosity).map_or("medium", Verbosity::as_str),
            }),
            tool_choice: self
                .tool_choice
                .as_ref()
                .map_or_else(|| json!("auto"), tool_choice),
            tools: Value::Array(self.tools.iter().flatten().filter_map(tool).collect()),
            served: ServedSettings::default(),
        }
    }
}

fn text_format(format: &ResponsesTextFormat) -> Value {
    match format {
        ResponsesTextFormat::Text => json!({"type": "text"}),
        ResponsesTextFormat::JsonObject => json!({"type": "json_object"}),
        ResponsesTextFormat::JsonSchema {
            name,
            schema,
            description,
            strict,
        } => json!({
            "type": "json_schema",
            "name": name,
            "schema": schema,
            "description": description,
            "strict": strict,
        }),
    }
}

fn tool_choice(choice: &ResponsesToolChoice) -> Value {
    match choice {
        ResponsesToolChoice::None => json!("none"),
        ResponsesToolChoice::Auto => json!("auto"),
        ResponsesToolChoice::Required => json!("required"),
        ResponsesToolChoice::Object(ToolChoiceObject::Function { name }) => {
            json!({"type": "function", "name": name})
        }
        ResponsesToolChoice::Object(ToolChoiceObject::Custom { name }) => {
            json!({"type": "custom", "name": name})
        }
        ResponsesToolChoice::Object(ToolChoiceObject::WebSearch {}) => {
            json!({"type": "web_search"})
        }
        ResponsesToolChoice::Object(ToolChoiceObject::WebSearch20250826 {}) => {
            json!({"type": "web_search_2025_08_26"})
        }
    }
}

fn function(f: &ResponsesFunctionTool) -> Value {
    json!({
        "type": "function",
        "name": f.name,
        "description": f.description,
        "parameters": f.parameters,
        "strict": f.strict,
    })
}

fn web_search(kind: &str, w: &ResponsesWebSearchTool) -> Value {
    let location = w.user_location.as_ref().map(|l| {
        json!({"city": l.city, "country": l.country, "region": l.region, "timezone": l.timezone})
    });
    json!({
        "type": kind,
        "search_context_size": w.search_context_size.map(|s| s.as_str()),
        "user_location": location,
    })
}

/// A declared tool as echoed; tools of kinds the library does not know are left out.
fn tool(t: &ResponsesTool) -> Option<Value> {
    Some(match t {
        ResponsesTool::Function(f) => function(f),
        ResponsesTool::Custom { name, .. } => json!({"type": "custom", "name": name}),
        ResponsesTool::Namespace {
            name,
            description,
            tools,
        } => {
            let members: Vec<Value> = tools
                .iter()
                .map(|m| match m {
                    ResponsesNamespaceTool::Function(f) => function(f),
                    ResponsesNamespaceTool::Custom { name } => {
                        json!({"type": "custom", "name": name})
                    }
                })
                .collect();
            json!({"type": "namespace", "name": name, "description": description, "tools": members})
        }
        ResponsesTool::WebSearch(w) => web_search("web_search", w),
        ResponsesTool::WebSearch20250826(w) => web_search("web_search_2025_08_26", w),
        ResponsesTool::Other => return None,
    })
}
