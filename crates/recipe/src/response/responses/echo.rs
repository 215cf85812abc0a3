//! The request settings a response object reports ("echo").

use serde_json::Value;

/// The request settings a response object reports ("echo").
///
/// `ResponsesRequest.echo()` builds it from the request body: the scalars as the request gave
/// them (temperature and `top_p` are f32 on the wire, so the object prints `0.3`), and the
/// reasoning, text, tool choice and tool settings already in their response-object JSON form
/// (`{"effort":…,"summary":…}`, `{"format":…,"verbosity":…}`, the `tool_choice` value, the list
/// of declared tools). `text.verbosity` is the request's or OpenAI's default, `"medium"` (the
/// official writes `null`, which the Responses schema does not allow: recipe/DEVIATIONS.md R5).
#[derive(Clone, Debug, PartialEq)]
pub struct ResponsesEcho {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub temperature: f32,
    pub top_p: f32,
    pub top_logprobs: u64,
    pub user: Option<String>,
    pub reasoning: Value,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Value,
    /// What a server reports beyond the fields the request type reads (an addition: the
    /// official object always reports these defaults; recipe/DEVIATIONS.md A2).
    pub served: ServedSettings,
}

/// Response-object fields the official always writes with their defaults, set by a server that
/// honours them (`ResponsesEcho.with_served` in Python).
#[derive(Clone, Debug, PartialEq)]
pub struct ServedSettings {
    pub parallel_tool_calls: bool,
    pub max_tool_calls: Option<u64>,
    /// A JSON object.
    pub metadata: Value,
    pub prompt_cache_key: Option<String>,
    pub safety_identifier: Option<String>,
    pub presence_penalty: f64,
    pub frequency_penalty: f64,
}

impl Default for ServedSettings {
    fn default() -> Self {
        ServedSettings {
            parallel_tool_calls: true,
            max_tool_calls: None,
            metadata: Value::Object(serde_json::Map::new()),
            prompt_cache_key: None,
            safety_identifier: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

impl Default for ResponsesEcho {
    /// The settings of an unspecified request.
    fn default() -> Self {
        ResponsesEcho {
            instructions: None,
            max_output_tokens: None,
            temperature: 1.0,
            top_p: 1.0,
            top_logprobs: 0,
            user: None,
            reasoning: serde_json::json!({"effort": null, "summary": null}),
            text: serde_json::json!({"format": {"type": "text"}, "verbosity": "medium"}),
            tool_choice: Value::String("auto".into()),
            tools: Value::Array(Vec::new()),
            served: ServedSettings::default(),
        }
    }
}

impl ResponsesEcho {
    /// All settings at once (the Rust-side constructor for `ResponsesRequest.echo()`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        instructions: Option<String>,
        max_output_tokens: Option<u64>,
        temperature: Option<f32>,
        top_p: Option<f32>,
        top_logprobs: Option<u64>,
        user: Option<String>,
        reasoning: Value,
        text: Value,
        tool_choice: Value,
        tools: Value,
    ) -> Self {
        ResponsesEcho {
            instructions,
            max_output_tokens,
            temperature: temperature.unwrap_or(1.0),
            top_p: top_p.unwrap_or(1.0),
            top_logprobs: top_logprobs.unwrap_or(0),
            user,
            reasoning,
            text,
            tool_choice,
            tools,
            served: ServedSettings::default(),
        }
    }
}
