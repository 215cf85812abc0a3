//! A resolved request -> [`ConversationRequest`]: the conversation, sampling, output constraint
//! and parsing options.

use serde_json::{json, Value};

use super::sampling::sampling;
use crate::conversation::{
    Conversation, Message, ReasoningEffort, ResponseFormat, Role, ToolChoice, ToolDefinition,
};
use crate::render::ModelVersion;
use crate::request::options::{
    ConversionOptions, InferenceOptions, OutputConstraint, ParsingOptions, ThinkingInitialStage,
};
use crate::request::ConversationRequest;

/// The compact JSON array of Chat Completions function tools the output constraint carries.
pub(crate) fn tools_constraint_json(tools: &[ToolDefinition]) -> String {
    let items: Vec<Value> = tools
        .iter()
        .map(|t| {
            let mut v = json!({
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": t.strict,
                }
            });
            if t.defer_loading {
                v["defer_loading"] = Value::Bool(true);
            }
            v
        })
        .collect();
    Value::Array(items).to_string()
}

/// Everything a protocol resolved; [`assemble`] turns it into the converted request.
pub(crate) struct Resolved {
    pub version: ModelVersion,
    pub thinking: bool,
    pub reasoning_effort: Option<ReasoningEffort>,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDefinition>,
    pub tool_choice: ToolChoice,
    pub format: ResponseFormat,
    /// The schema text of a JSON format's output constraint.
    pub format_constraint: Option<String>,
    pub stop_sequences: Vec<String>,
    pub max_tokens: Option<u32>,
    /// As requested; [`sampling`] applies the version's rules.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub logprobs: bool,
    pub top_logprobs: Option<u8>,
    pub seed: Option<u64>,
    pub stream: bool,
    pub output: crate::request::OutputOptions,
}

/// The conversation, sampling and parsing options of a resolved request.
pub(crate) fn assemble(r: Resolved, options: &ConversionOptions) -> ConversationRequest {
    let has_tools = !r.tools.is_empty();
    let (temperature, top_p) = sampling(r.version, r.thinking, has_tools, r.temperature, r.top_p);
    let inference = InferenceOptions {
        max_tokens: r.max_tokens,
        temperature: Some(temperature),
        top_p: Some(top_p),
        logprobs: r.logprobs,
        top_logprobs: r.top_logprobs,
        seed: r.seed,
        output_constraint: output_constraint(&r),
    };
    let parsing = ParsingOptions {
        parse_tool_calls: has_tools,
        starts_in_tool_calls: has_tools && r.tool_choice == ToolChoice::Required,
        parse_json_output: r.format == ResponseFormat::JsonObject,
        thinking_initial_stage: r.thinking.then(|| initial_stage(&r.messages)),
        stop_sequences: r.stop_sequences,
        special_tokens: options.special_tokens.clone(),
    };
    ConversationRequest {
        conversation: std::sync::Arc::new(Conversation {
            messages: r.messages,
            thinking_mode: r.thinking,
            tools: r.tools,
            tool_choice: r.tool_choice,
            reasoning_effort: r.reasoning_effort,
            response_format: r.format,
        }),
        inference_options: inference,
        parsing_options: parsing,
        model_version: r.version,
        stream: r.stream,
        output: r.output,
    }
}

fn output_constraint(r: &Resolved) -> Option<OutputConstraint> {
    if !r.tools.is_empty() {
        let kind = if r.tool_choice == ToolChoice::Required {
            "tool_call_required"
        } else {
            "tool_call"
        };
        return Some(OutputConstraint {
            kind: kind.into(),
            schema: tools_constraint_json(&r.tools),
        });
    }
    match &r.format {
        ResponseFormat::JsonObject | ResponseFormat::JsonSchema(_) => Some(OutputConstraint {
            kind: "json".into(),
            schema: r.format_constraint.clone().unwrap_or_default(),
        }),
        ResponseFormat::Regex(re) => Some(OutputConstraint {
            kind: "regex".into(),
            schema: re.clone(),
        }),
        ResponseFormat::Text => None,
    }
}

/// Where the parser starts in thinking mode: a prefix continuation resumes its stage.
fn initial_stage(messages: &[Message]) -> ThinkingInitialStage {
    match messages.last() {
        Some(m) if m.role == Role::Assistant && m.prefix => {
            if !m.content.is_empty() {
                ThinkingInitialStage::ContentContinuation
            } else if m
                .reasoning_content
                .as_deref()
                .is_some_and(|s| !s.is_empty())
            {
                ThinkingInitialStage::ReasoningContinuation
            } else {
                ThinkingInitialStage::ReasoningStart
            }
        }
        _ => ThinkingInitialStage::ReasoningStart,
    }
}
