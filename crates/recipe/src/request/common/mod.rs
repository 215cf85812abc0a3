//! Conversion steps shared by the three protocols. Each protocol calls them in the order
//! deepseek-recipe checks things, so that a request with several problems reports the same one.

mod assemble;
mod block_text;
mod checks;
mod format;
mod sampling;
mod thinking;
mod tools;

pub(crate) use assemble::{assemble, Resolved};
pub(crate) use block_text::BlockText;
pub(crate) use checks::{
    check_max_tokens, check_prefix_rules, check_stop, check_strict_rules, check_tool_rules,
    check_top_logprobs,
};
pub(crate) use format::{finalize_format, mentions_json, FormatSpec};
pub(crate) use sampling::{check_temperature, check_top_p};
pub(crate) use thinking::{apply_reasoning_policy, resolve_thinking, Effort};
pub(crate) use tools::{
    check_tool_name, finalize_tools, resolve_tool_choice, ChoiceSpec, ToolSpec,
};

use super::options::ConversionOptions;
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
