//! What the backend pushes into a stream processor.

/// Prompt-side token counts reported by the backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromptUsage {
    pub prompt_tokens: u64,
    pub prompt_cache_hit_tokens: u64,
}

/// Why the backend stopped; output parsing decides the protocol's finish reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InferenceFinishReason {
    Stop,
    Length,
    ContentFilter,
}

/// The log probability of one generated token and its top alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f64,
    pub top_logprobs: Vec<(u32, f64)>,
}

/// One backend update.
#[derive(Clone, Debug, PartialEq)]
pub enum InferenceChunk {
    /// The request was admitted: prompt usage and the system fingerprint.
    Ready {
        prompt_usage: Option<PromptUsage>,
        system_fingerprint: Option<String>,
    },
    /// Decoded text and the number of tokens it accounts for.
    Text {
        content: String,
        token_count: u64,
    },
    /// Token ids, with one log probability entry per id when the request asked for them.
    Tokens {
        token_ids: Vec<u32>,
        logprobs: Option<Vec<TokenLogprob>>,
    },
    Finish(InferenceFinishReason),
}
