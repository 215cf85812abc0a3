//! Chat Completions request -> [`ConversationRequest`]: the request-level checks, in the
//! official order.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::fast_read::FastRequest;
use super::turns::convert_messages;
use super::wire::{
    ChatCompletionRequest, ChatCompletionResponseFormat, ChatToolChoice, StringOrList, ThinkingType,
};
use crate::error::{ConversionError, RecipeError};
use crate::render::ModelVersion;
use crate::request::body::{read_fast, to_value};
use crate::request::common::{
    self, bad, ChoiceSpec, Effort, FormatSpec, Resolved, Result, ToolSpec,
};
use crate::request::options::ConversionOptions;
use crate::request::{parse_body_boxed, ConversationRequest, OutputOptions, RequestBody};
use crate::special::SpecialToken;

impl ChatCompletionRequest {
    /// Parse a body (see [`crate::request::parse_body`]), reading `max_completion_tokens` on the
    /// side.
    pub fn from_body(body: RequestBody<'_>) -> std::result::Result<Self, RecipeError> {
        Self::from_body_boxed(body).map(|request| *request)
    }

    /// [`Self::from_body`], boxed (see [`parse_body_boxed`]).
    pub fn from_body_boxed(body: RequestBody<'_>) -> std::result::Result<Box<Self>, RecipeError> {
        let from_value = |value: Value| -> std::result::Result<_, RecipeError> {
            let limit = value.get("max_completion_tokens").cloned();
            Ok((parse_body_boxed(RequestBody::Value(value))?, limit))
        };
        let (mut request, limit): (Box<ChatCompletionRequest>, Option<Value>) = match body {
            // One pass: the typed fast path with the limit taken out on the way; anything it
            // does not read goes through a value, where a repeated key's last value wins (the
            // limit's too).
            RequestBody::Text(bytes) => {
                match read_fast(bytes, |de| de.deserialize_any(FastRequest)) {
                    Some(found) => found,
                    None => from_value(to_value(RequestBody::Text(bytes))?)?,
                }
            }
            RequestBody::Value(value) => from_value(value)?,
        };
        // Read like `max_tokens`, with the same message for a bad value.
        request.max_completion_tokens = match limit {
            None => None,
            Some(v) => Option::<u32>::deserialize(v)
                .map_err(|e| RecipeError::InvalidBody(format!("invalid request body: {e}")))?,
        };
        Ok(request)
    }

    pub fn convert(
        self,
        options: &ConversionOptions,
    ) -> std::result::Result<ConversationRequest, ConversionError> {
        let version = common::resolve_model(options, &self.model)?;
        let tool_specs: Vec<ToolSpec> = self
            .tools
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                common::check_tool_name(&t.function.name, &format!("tools[{i}].function.name"))?;
                Ok(ToolSpec {
                    name: t.function.name,
                    description: t.function.description,
                    parameters: t.function.parameters,
                    strict: t.function.strict,
                    defer_loading: false,
                })
            })
            .collect::<Result<_>>()?;
        let image_token = options.special_tokens.token(SpecialToken::Image);
        let vision = version == ModelVersion::DeepseekV41Flash;
        let mut messages = convert_messages(self.messages, image_token, vision)?;

        let has_response_format = self.response_format.is_some();
        let format_spec = match self.response_format {
            None | Some(ChatCompletionResponseFormat::Text) => FormatSpec::Text,
            Some(ChatCompletionResponseFormat::JsonObject) => FormatSpec::JsonObject,
            Some(ChatCompletionResponseFormat::JsonSchema { json_schema }) => {
                FormatSpec::JsonSchema {
                    schema: json_schema.schema,
                    strict: json_schema.strict == Some(true),
                }
            }
            Some(ChatCompletionResponseFormat::Regex { regex }) => FormatSpec::Regex(regex),
        };
        if matches!(format_spec, FormatSpec::JsonObject) && !common::mentions_json(&messages) {
            return Err(bad(
                "Prompt must contain the word 'json' in some form to use 'response_format' of type 'json_object'.",
            ));
        }
        let choice = match self.tool_choice {
            None | Some(ChatToolChoice::Auto) => ChoiceSpec::Auto,
            Some(ChatToolChoice::None) => ChoiceSpec::None,
            Some(ChatToolChoice::Required) => ChoiceSpec::Required,
            Some(ChatToolChoice::Function(name)) => ChoiceSpec::Named(name),
        };
        let switch = self.thinking.map(|t| t.kind != ThinkingType::Disabled);
        let (thinking, effort) =
            common::resolve_thinking(switch, self.reasoning_effort.map(Effort::from), options);
        let declared = !tool_specs.is_empty();
        // Declared tools count, even when `tool_choice: none` drops them.
        common::apply_reasoning_policy(
            &mut messages,
            thinking,
            declared,
            options,
            "reasoning_content",
        )?;
        let mut tools = common::finalize_tools(tool_specs, &choice)?;
        let (format, format_constraint) = common::finalize_format(format_spec)?;

        let tool_choice = common::resolve_tool_choice(choice, &mut tools, thinking)?;
        common::check_prefix_rules(declared, &messages, &format)?;

        let stop = match self.stop {
            None => Vec::new(),
            Some(StringOrList::One(s)) => {
                common::check_stop(std::slice::from_ref(&s), true, "stop")?;
                vec![s]
            }
            Some(StringOrList::Many(v)) => {
                common::check_stop(&v, false, "stop")?;
                v
            }
        };
        let stream = self.stream.unwrap_or(false);
        let include_usage = self
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(bad("stream_options should be set along with stream = true"));
        }
        common::check_strict_rules(&tools, has_response_format)?;
        if self.n.is_some_and(|n| n != 1) {
            return Err(bad("Invalid n value (currently only n = 1 is supported)"));
        }
        check_penalty("presence_penalty", self.presence_penalty)?;
        check_penalty("frequency_penalty", self.frequency_penalty)?;
        common::check_temperature(self.temperature)?;
        common::check_top_p(self.top_p)?;
        let logprobs = self.logprobs.unwrap_or(false);
        common::check_top_logprobs(self.top_logprobs, logprobs)?;
        // Both limits are checked; OpenAI's current name wins over the deprecated one.
        common::check_max_tokens(self.max_tokens, thinking, options)?;
        common::check_max_tokens(self.max_completion_tokens, thinking, options)?;
        let max_tokens = self.max_completion_tokens.or(self.max_tokens);
        if self.seed.is_some_and(|s| s >= 1 << 63) {
            return Err(bad(
                "Invalid seed value, the valid range of seed is [0, 2^63)",
            ));
        }

        Ok(common::assemble(
            Resolved {
                version,
                thinking,
                reasoning_effort: effort,
                messages,
                tools,
                tool_choice,
                format,
                format_constraint,
                stop_sequences: stop,
                max_tokens,
                temperature: self.temperature,
                top_p: self.top_p,
                logprobs,
                top_logprobs: self.top_logprobs,
                seed: self.seed,
                stream,
                output: OutputOptions {
                    include_usage,
                    ..Default::default()
                },
            },
            options,
        ))
    }
}

fn check_penalty(name: &str, value: Option<f32>) -> Result<()> {
    match value {
        Some(v) if !(-2.0..=2.0).contains(&v) => Err(bad(format!(
            "Invalid {name} value, the valid range of {name} is [-2, 2]"
        ))),
        _ => Ok(()),
    }
}
