//! Rules on combinations of request fields, and the ranges of limits and stop sequences.

use super::{bad, Result};
use crate::conversation::{Message, ResponseFormat, Role, ToolDefinition};
use crate::request::options::ConversionOptions;

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
