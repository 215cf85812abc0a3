//! Responses request -> [`ConversationRequest`]: the request-level checks, in the official
//! order.

use super::wire::{
    ResponsesRequest, ResponsesTextFormat, ResponsesTool, ResponsesToolChoice, ToolChoiceObject,
};
use crate::conversation::ResponseFormat;
use crate::error::{ConversionError, RecipeError};
use crate::render::ModelVersion;
use crate::request::common::{self, bad, ChoiceSpec, Effort, FormatSpec, Resolved, ToolSpec};
use crate::request::options::{ConversionOptions, WebSearchBehavior};
use crate::request::{
    parse_body, parse_body_boxed, ConversationRequest, OutputOptions, RequestBody,
};
use crate::special::SpecialToken;

impl ResponsesRequest {
    pub fn from_body(body: RequestBody<'_>) -> std::result::Result<Self, RecipeError> {
        parse_body(body)
    }

    /// [`Self::from_body`], boxed (see [`parse_body_boxed`]).
    pub fn from_body_boxed(body: RequestBody<'_>) -> std::result::Result<Box<Self>, RecipeError> {
        parse_body_boxed(body)
    }

    pub fn convert(
        self,
        options: &ConversionOptions,
    ) -> std::result::Result<ConversationRequest, ConversionError> {
        let version = common::resolve_model(options, &self.model)?;
        let tool_specs: Vec<ToolSpec> = self
            .tool_specs(options, version, true)?
            .into_iter()
            .map(|s| s.spec)
            .collect();
        let image_token = options.special_tokens.token(SpecialToken::Image);
        let vision = version == ModelVersion::DeepseekV41Flash;
        let mut messages = self.convert_input(image_token, vision)?;
        let choice = match &self.tool_choice {
            None | Some(ResponsesToolChoice::Auto) => ChoiceSpec::Auto,
            Some(ResponsesToolChoice::None) => ChoiceSpec::None,
            Some(ResponsesToolChoice::Required) => ChoiceSpec::Required,
            Some(ResponsesToolChoice::Object(o)) => match o {
                ToolChoiceObject::Function { name } | ToolChoiceObject::Custom { name } => {
                    ChoiceSpec::Named(name.clone())
                }
                ToolChoiceObject::WebSearch {} | ToolChoiceObject::WebSearch20250826 {} => {
                    if options.responses_web_search == WebSearchBehavior::Reject {
                        return Err(bad("Server tools are not supported"));
                    }
                    ChoiceSpec::Auto
                }
            },
        };
        let declared = !tool_specs.is_empty();

        let switch = None;
        let effort = self
            .reasoning
            .as_ref()
            .and_then(|r| r.effort)
            .map(Effort::from);
        let (thinking, reasoning_effort) = common::resolve_thinking(switch, effort, options);
        // Declared tools count, even when `tool_choice: none` drops them.
        common::apply_reasoning_policy(
            &mut messages,
            thinking,
            declared,
            options,
            "reasoning_text",
        )?;
        let mut tools = common::finalize_tools(tool_specs, &choice)?;
        let tool_choice = common::resolve_tool_choice(choice, &mut tools, thinking)?;

        let format_spec = match self.text.as_ref().map(|t| t.format.clone()) {
            None | Some(ResponsesTextFormat::Text) => FormatSpec::Text,
            Some(ResponsesTextFormat::JsonObject) => FormatSpec::JsonObject,
            Some(ResponsesTextFormat::JsonSchema { schema, strict, .. }) => {
                FormatSpec::JsonSchema {
                    schema,
                    strict: strict == Some(true),
                }
            }
        };
        if matches!(format_spec, FormatSpec::JsonObject) && !common::mentions_json(&messages) {
            return Err(bad(
                "Response input messages must contain the word 'json' in some form to use 'text.format' of type 'json_object'.",
            ));
        }
        let (format, format_constraint) = common::finalize_format(format_spec)?;
        // Only a JSON format conflicts with strict tools here (Chat counts any format).
        let json_format = !matches!(format, ResponseFormat::Text | ResponseFormat::Regex(_));
        common::check_tool_rules(false, &tools, &messages, &format, json_format)?;
        common::check_temperature(self.temperature)?;
        common::check_top_p(self.top_p)?;
        if self.top_logprobs.is_some_and(|n| n > 20) {
            return Err(bad(
                "Invalid top_logprobs value, the valid range of top_logprobs is [0, 20].",
            ));
        }
        common::check_max_tokens(self.max_output_tokens, thinking, options)?;

        // Calls of declared custom tools come back as `custom_tool_call` items.
        let custom_tools = self
            .tools
            .iter()
            .flatten()
            .filter_map(|t| match t {
                ResponsesTool::Custom { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect();
        Ok(common::assemble(
            Resolved {
                version,
                thinking,
                reasoning_effort,
                messages,
                tools,
                tool_choice,
                format,
                format_constraint,
                stop_sequences: Vec::new(),
                max_tokens: self.max_output_tokens,
                temperature: self.temperature,
                top_p: self.top_p,
                logprobs: self.top_logprobs.is_some(),
                top_logprobs: self.top_logprobs,
                seed: None,
                stream: self.stream.unwrap_or(false),
                output: OutputOptions {
                    custom_tools,
                    ..Default::default()
                },
            },
            options,
        ))
    }
}
