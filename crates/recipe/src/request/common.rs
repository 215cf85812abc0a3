//! Conversion steps shared by the three protocols. Each protocol calls them in the order
//! deepseek-recipe checks things, so that a request with several problems reports the same one.

use serde_json::{json, Value};

use super::options::{
    ConversionOptions, InferenceOptions, OutputConstraint, ParsingOptions,
    ReasoningContentBehavior, ThinkingInitialStage,
};
use super::schema::{self, SchemaError, Top};
use super::ConversationRequest;
use crate::conversation::{
    Conversation, Message, ReasoningEffort, ResponseFormat, Role, ToolChoice, ToolDefinition,
};
use crate::error::ConversionError;
use crate::render::ModelVersion;

pub(crate) type Result<T> = std::result::Result<T, ConversionError>;

pub(crate) fn bad(message: impl Into<String>) -> ConversionError {
    ConversionError::bad_request(message)
}

pub(crate) fn resolve_model(options: &ConversionOptions, model: &str) -> Result<ModelVersion> {
    options
        .model_versions_by_name
        .get(model)
        .copied()
        .ok_or_else(|| {
            let names: Vec<&str> = options
                .model_versions_by_name
                .keys()
                .map(String::as_str)
                .collect();
            bad(format!(
                "The supported API model names are {}, but you passed {model}.",
                names.join(", ")
            ))
        })
}

pub(crate) fn check_tool_name(name: &str, path: &str) -> Result<()> {
    if name.is_empty() {
        return Err(bad(format!(
            "Invalid '{path}': empty string. Expected a string with minimum length 1, but got an empty string instead."
        )));
    }
    let ok = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(bad(format!(
            "Invalid '{path}': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
        )))
    }
}

/// A declared tool before its schema is checked.
#[derive(Clone, Debug)]
pub(crate) struct ToolSpec {
    pub name: String,
    pub description: Option<String>,
    /// `None` when the request gave no schema (or `null`).
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
    pub defer_loading: bool,
}

/// Check names are unique and schemas valid, normalising strict ones, tool by tool. With
/// `tool_choice: none` the tools are dropped unchecked.
pub(crate) fn finalize_tools(
    specs: Vec<ToolSpec>,
    choice: &ChoiceSpec,
) -> Result<Vec<ToolDefinition>> {
    if *choice == ChoiceSpec::None {
        return Ok(Vec::new());
    }
    let mut out: Vec<ToolDefinition> = Vec::with_capacity(specs.len());
    for spec in specs {
        if out.iter().any(|t| t.name == spec.name) {
            return Err(bad("Tool names must be unique."));
        }
        let parameters = tool_parameters(&spec)?;
        out.push(ToolDefinition {
            name: spec.name,
            description: spec.description,
            parameters,
            strict: spec.strict,
            defer_loading: spec.defer_loading,
        });
    }
    Ok(out)
}

fn tool_parameters(spec: &ToolSpec) -> Result<Value> {
    // Chat and Responses read a `null` schema as absent; Messages passes it on to be refused.
    let given = spec.parameters.as_ref();
    if spec.strict == Some(true) {
        let schema = given.cloned().unwrap_or_else(|| json!({"type": "object"}));
        return schema::normalize_strict(&schema, Top::ToolParameters).map_err(|e| match e {
            SchemaError::Shape(m) => bad(format!("Invalid tool parameters schema : {m}")),
            SchemaError::Rule(m) => bad(m),
        });
    }
    let Some(schema) = given else {
        return Ok(json!({}));
    };
    let name = &spec.name;
    schema::meta_validate(schema)
        .map_err(|m| bad(format!("Invalid schema for function '{name}': {m}")))?;
    let ty = schema.get("type").cloned().unwrap_or(Value::Null);
    if ty != Value::String("object".into()) {
        return Err(bad(format!(
            "Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"', got 'type: {ty}'."
        )));
    }
    Ok(schema.clone())
}

/// A requested response format before its schema is checked.
#[derive(Clone, Debug)]
pub(crate) enum FormatSpec {
    Text,
    JsonObject,
    JsonSchema { schema: Value, strict: bool },
    Regex(String),
}

/// The conversation's response format and the schema the output constraint carries.
pub(crate) fn finalize_format(spec: FormatSpec) -> Result<(ResponseFormat, Option<String>)> {
    Ok(match spec {
        FormatSpec::Text => (ResponseFormat::Text, None),
        FormatSpec::JsonObject => (ResponseFormat::JsonObject, Some(String::new())),
        FormatSpec::Regex(r) => (ResponseFormat::Regex(r), None),
        FormatSpec::JsonSchema { schema, strict } => {
            let constraint = if strict {
                schema::normalize_strict(&schema, Top::ResponseFormat).map_err(|e| match e {
                    SchemaError::Shape(m) => bad(format!("Invalid json schema: {m}")),
                    SchemaError::Rule(m) => bad(m),
                })?
            } else {
                schema::meta_validate(&schema)
                    .map_err(|m| bad(format!("Invalid json schema: {m}")))?;
                schema.clone()
            };
            (
                ResponseFormat::JsonSchema(schema),
                Some(constraint.to_string()),
            )
        }
    })
}

/// Does any message mention "json" (any case)?
pub(crate) fn mentions_json(messages: &[Message]) -> bool {
    messages
        .iter()
        .any(|m| m.content.to_ascii_lowercase().contains("json"))
}

/// The thinking switch and effort as the request asks for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Effort {
    None,
    Low,
    High,
    XHigh,
    Max,
}

/// Thinking mode: an explicit switch wins; else an effort of `none` turns it off and any other
/// effort on; else the configured default. The effort applies only in thinking mode.
pub(crate) fn resolve_thinking(
    switch: Option<bool>,
    effort: Option<Effort>,
    options: &ConversionOptions,
) -> (bool, Option<ReasoningEffort>) {
    let thinking = switch.unwrap_or(match effort {
        Some(Effort::None) => false,
        Some(_) => true,
        None => options.default_thinking_mode,
    });
    let effort = thinking.then_some(match effort {
        Some(Effort::Low) => ReasoningEffort::Low,
        Some(Effort::XHigh) => ReasoningEffort::XHigh,
        Some(Effort::Max) => ReasoningEffort::Max,
        _ => ReasoningEffort::High,
    });
    (thinking, effort)
}

/// Reasoning in history: dropped outside thinking mode; in thinking mode a missing one is filled
/// with "" or, with `Reject`, refused where it must be passed back: on an assistant message after
/// the last user message that makes tool calls or is answered while tools are declared.
pub(crate) fn apply_reasoning_policy(
    messages: &mut [Message],
    thinking: bool,
    has_tools: bool,
    options: &ConversionOptions,
    field: &str,
) -> Result<()> {
    let last_user = messages.iter().rposition(|m| m.role == Role::User);
    for (i, m) in messages.iter_mut().enumerate() {
        if m.role != Role::Assistant {
            continue;
        }
        if !thinking {
            m.reasoning_content = None;
            continue;
        }
        if m.reasoning_content.is_none() {
            let in_loop = last_user.is_none_or(|u| i > u) && (has_tools || m.tool_calls.is_some());
            if options.reasoning_content_behavior == ReasoningContentBehavior::Reject && in_loop {
                return Err(bad(format!(
                    "The `{field}` in the thinking mode must be passed back to the API."
                )));
            }
            m.reasoning_content = Some(String::new());
        }
    }
    Ok(())
}

/// The requested tool choice before tools are known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ChoiceSpec {
    Auto,
    None,
    Required,
    Named(String),
}

/// Apply the tool choice to the tool list.
pub(crate) fn resolve_tool_choice(
    choice: ChoiceSpec,
    tools: &mut Vec<ToolDefinition>,
    thinking: bool,
) -> Result<ToolChoice> {
    const THINKING: &str = "Thinking mode does not support this tool_choice";
    Ok(match choice {
        ChoiceSpec::Auto => ToolChoice::Auto,
        ChoiceSpec::None => {
            tools.clear();
            ToolChoice::None
        }
        ChoiceSpec::Required if tools.is_empty() => ToolChoice::Auto,
        ChoiceSpec::Required => {
            if thinking {
                return Err(bad(THINKING));
            }
            ToolChoice::Required
        }
        ChoiceSpec::Named(_) if tools.is_empty() => ToolChoice::Auto,
        ChoiceSpec::Named(name) => {
            let Some(pos) = tools.iter().position(|t| t.name == name) else {
                return Err(bad(format!(
                    "Invalid value for 'tool_call': no function named '{name}' was specified in the 'tools' parameter."
                )));
            };
            if thinking {
                return Err(bad(THINKING));
            }
            let keep = tools.swap_remove(pos);
            tools.clear();
            tools.push(keep);
            ToolChoice::Required
        }
    })
}

/// Rules on prefix continuations and strict tools, in this order (Responses checks them
/// together; Chat checks `stop` and `stream_options` in between, as the official does).
pub(crate) fn check_tool_rules(
    declared: bool,
    tools: &[ToolDefinition],
    messages: &[Message],
    format: &ResponseFormat,
    has_response_format: bool,
) -> Result<()> {
    check_prefix_rules(declared, messages, format)?;
    check_strict_rules(tools, has_response_format)
}

/// A prefix continuation comes with neither a `json_object` response format nor tools
/// (`declared` is the tool list before `tool_choice: none` emptied it).
pub(crate) fn check_prefix_rules(
    declared: bool,
    messages: &[Message],
    format: &ResponseFormat,
) -> Result<()> {
    let prefix = messages
        .last()
        .is_some_and(|m| m.role == Role::Assistant && m.prefix);
    if prefix && *format == ResponseFormat::JsonObject {
        return Err(bad(
            "response_format json_object should not be used with prefix",
        ));
    }
    if prefix && declared {
        return Err(bad("Function call should not be used with prefix"));
    }
    Ok(())
}

/// Strict and non-strict tools do not mix, and strict tools exclude a response format.
pub(crate) fn check_strict_rules(
    tools: &[ToolDefinition],
    has_response_format: bool,
) -> Result<()> {
    let strict = tools.iter().filter(|t| t.strict == Some(true)).count();
    if strict > 0 && strict < tools.len() {
        return Err(bad(
            "Cannot use strict tool with non-strict tool in the same request",
        ));
    }
    if strict > 0 && has_response_format {
        return Err(bad("response_format should not be used with tools"));
    }
    Ok(())
}

/// `temperature` in [0, 2] and `top_p` in (0, 1], then the values the model version samples with.
pub(crate) fn check_temperature(t: Option<f32>) -> Result<()> {
    match t {
        Some(t) if !(0.0..=2.0).contains(&t) => Err(bad(
            "Invalid temperature value, the valid range of temperature is [0, 2]",
        )),
        _ => Ok(()),
    }
}

pub(crate) fn check_top_p(p: Option<f32>) -> Result<()> {
    match p {
        Some(p) if !(p > 0.0 && p <= 1.0) => Err(bad(
            "Invalid top_p value, the valid range of top_p is (0, 1.0]",
        )),
        _ => Ok(()),
    }
}

/// The sampling values the model version uses. V4-Pro in thinking mode samples at top_p 0.95
/// when tools are declared and 1.0 otherwise, whatever the request says.
pub(crate) fn sampling(
    version: ModelVersion,
    thinking: bool,
    has_tools: bool,
    temperature: Option<f32>,
    top_p: Option<f32>,
) -> (f32, f32) {
    let temperature = if thinking {
        1.0
    } else {
        temperature.unwrap_or(1.0)
    };
    let top_p = match (version, thinking) {
        (ModelVersion::DeepseekV4Pro, true) if has_tools => 0.95,
        (ModelVersion::DeepseekV4Pro, true) => 1.0,
        (ModelVersion::DeepseekV4Pro, false) => top_p.unwrap_or(1.0),
        (ModelVersion::DeepseekV41Flash, true) => top_p.map_or(1.0, |p| p.max(0.95)),
        (ModelVersion::DeepseekV41Flash, false) => 1.0,
    };
    (temperature, top_p)
}

pub(crate) fn check_max_tokens(
    max_tokens: Option<u32>,
    thinking: bool,
    options: &ConversionOptions,
) -> Result<()> {
    let bound = if thinking {
        options.thinking_max_tokens_upper_bound
    } else {
        options.non_thinking_max_tokens_upper_bound
    };
    match max_tokens {
        Some(m) if m == 0 || m > bound => Err(bad(format!(
            "Invalid max_tokens value, the valid range of max_tokens is [1, {bound}]"
        ))),
        _ => Ok(()),
    }
}

pub(crate) fn check_top_logprobs(top_logprobs: Option<u8>, logprobs: bool) -> Result<()> {
    match top_logprobs {
        Some(_) if !logprobs => Err(bad(
            "Invalid top_logprobs and logprobs value, logprobs must be set to true if top_logprobs is used.",
        )),
        Some(n) if n > 20 => Err(bad(
            "Invalid top_logprobs value, the valid range of top_logprobs is [0, 20].",
        )),
        _ => Ok(()),
    }
}

pub(crate) fn check_stop(stop: &[String], single: bool, path_prefix: &str) -> Result<()> {
    if stop.len() > 16 {
        return Err(bad(format!("Stop string array too long: {}", stop.len())));
    }
    for (i, s) in stop.iter().enumerate() {
        if s.is_empty() {
            let path = if single {
                path_prefix.to_string()
            } else {
                format!("{path_prefix}[{i}]")
            };
            return Err(bad(format!(
                "Invalid '{path}': empty string. Expected a string with minimum length 1, but got an empty string instead."
            )));
        }
    }
    Ok(())
}

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
    pub output: super::OutputOptions,
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

/// Message text assembled from content blocks: blocks joined by blank lines, each image as one
/// image token whose span is recorded.
#[derive(Default)]
pub(crate) struct BlockText {
    text: String,
    blocks: usize,
    placeholders: Vec<(usize, usize)>,
}

impl BlockText {
    fn separate(&mut self) {
        if self.blocks > 0 {
            self.text.push_str("\n\n");
        }
        self.blocks += 1;
    }

    pub fn push_text(&mut self, text: &str) {
        self.separate();
        self.text.push_str(text);
    }

    pub fn push_image(&mut self, image_token: &str) {
        self.separate();
        let start = self.text.len();
        self.text.push_str(image_token);
        self.placeholders.push((start, self.text.len()));
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// (text, placeholder spans)
    pub fn finish(self) -> (String, Vec<(usize, usize)>) {
        (self.text, self.placeholders)
    }
}
