//! Conversion settings and the options a conversion produces.

use std::collections::BTreeMap;

use crate::render::ModelVersion;
use crate::special::SpecialTokens;

/// What to do with an assistant history message that lacks reasoning in thinking mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReasoningContentBehavior {
    #[default]
    FillEmpty,
    Reject,
}

/// What to do with web-search tool declarations, choices and Messages server-tool blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebSearchBehavior {
    Drop,
    Reject,
}

pub const DEFAULT_MAX_TOKENS_UPPER_BOUND: u32 = 393_216;

#[derive(Clone, Debug, PartialEq)]
pub struct ConversionOptions {
    pub default_thinking_mode: bool,
    pub reasoning_content_behavior: ReasoningContentBehavior,
    pub responses_web_search: WebSearchBehavior,
    pub messages_web_search: WebSearchBehavior,
    pub thinking_max_tokens_upper_bound: u32,
    pub non_thinking_max_tokens_upper_bound: u32,
    pub special_tokens: SpecialTokens,
    /// Accepted model names; sorted, which is also the order the error message lists them in.
    pub model_versions_by_name: BTreeMap<String, ModelVersion>,
}

impl Default for ConversionOptions {
    fn default() -> Self {
        let mut names = BTreeMap::new();
        names.insert("DeepSeek-V4-Pro".to_string(), ModelVersion::DeepseekV4Pro);
        names.insert(
            "DeepSeek-V4.1-Flash".to_string(),
            ModelVersion::DeepseekV41Flash,
        );
        ConversionOptions {
            default_thinking_mode: true,
            reasoning_content_behavior: ReasoningContentBehavior::FillEmpty,
            responses_web_search: WebSearchBehavior::Drop,
            messages_web_search: WebSearchBehavior::Reject,
            thinking_max_tokens_upper_bound: DEFAULT_MAX_TOKENS_UPPER_BOUND,
            non_thinking_max_tokens_upper_bound: DEFAULT_MAX_TOKENS_UPPER_BOUND,
            special_tokens: SpecialTokens::default(),
            model_versions_by_name: names,
        }
    }
}

/// A constraint the backend may enforce by constrained decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputConstraint {
    /// `json`, `regex`, `tool_call` or `tool_call_required`.
    pub kind: String,
    /// Compact JSON schema, the regex, the tool list as a compact JSON array, or "" for any JSON.
    pub schema: String,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct InferenceOptions {
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub logprobs: bool,
    pub top_logprobs: Option<u8>,
    pub seed: Option<u64>,
    pub output_constraint: Option<OutputConstraint>,
}

/// Where parsing begins in thinking mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThinkingInitialStage {
    ReasoningStart,
    ReasoningContinuation,
    ContentContinuation,
}

impl ThinkingInitialStage {
    pub fn starts_in_reasoning(self) -> bool {
        !matches!(self, ThinkingInitialStage::ContentContinuation)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ParsingOptions {
    pub parse_tool_calls: bool,
    pub starts_in_tool_calls: bool,
    pub parse_json_output: bool,
    pub thinking_initial_stage: Option<ThinkingInitialStage>,
    pub stop_sequences: Vec<String>,
    pub special_tokens: SpecialTokens,
}

impl Default for ParsingOptions {
    fn default() -> Self {
        ParsingOptions {
            parse_tool_calls: true,
            starts_in_tool_calls: false,
            parse_json_output: false,
            thinking_initial_stage: None,
            stop_sequences: Vec::new(),
            special_tokens: SpecialTokens::default(),
        }
    }
}
