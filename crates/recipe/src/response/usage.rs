//! Token usage as each protocol reports it.

use super::json;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// Reported for token input in thinking mode only (see the processor).
    pub reasoning_tokens: Option<u64>,
}

impl Usage {
    fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    /// Chat Completions: OpenAI's fields plus DeepSeek's cache hit / miss counts.
    pub fn chat_json(&self, out: &mut String) {
        out.push_str("{\"prompt_tokens\":");
        json::uint(out, self.prompt_tokens);
        out.push_str(",\"completion_tokens\":");
        json::uint(out, self.completion_tokens);
        out.push_str(",\"total_tokens\":");
        json::uint(out, self.total());
        out.push_str(",\"prompt_tokens_details\":{\"cached_tokens\":");
        json::uint(out, self.cached_tokens);
        out.push('}');
        if let Some(r) = self.reasoning_tokens {
            out.push_str(",\"completion_tokens_details\":{\"reasoning_tokens\":");
            json::uint(out, r);
            out.push('}');
        }
        out.push_str(",\"prompt_cache_hit_tokens\":");
        json::uint(out, self.cached_tokens);
        out.push_str(",\"prompt_cache_miss_tokens\":");
        json::uint(out, self.prompt_tokens.saturating_sub(self.cached_tokens));
        out.push('}');
    }

    pub fn responses_json(&self, out: &mut String) {
        out.push_str("{\"input_tokens\":");
        json::uint(out, self.prompt_tokens);
        out.push_str(",\"input_tokens_details\":{\"cached_tokens\":");
        json::uint(out, self.cached_tokens);
        out.push_str("},\"output_tokens\":");
        json::uint(out, self.completion_tokens);
        out.push_str(",\"output_tokens_details\":{\"reasoning_tokens\":");
        json::uint(out, self.reasoning_tokens.unwrap_or(0));
        out.push_str("},\"total_tokens\":");
        json::uint(out, self.total());
        out.push('}');
    }

    /// Anthropic counts uncached input separately from cache reads.
    pub fn messages_json(&self, out: &mut String) {
        out.push_str("{\"input_tokens\":");
        json::uint(out, self.prompt_tokens.saturating_sub(self.cached_tokens));
        out.push_str(",\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":");
        json::uint(out, self.cached_tokens);
        out.push_str(",\"output_tokens\":");
        json::uint(out, self.completion_tokens);
        out.push_str(",\"service_tier\":\"standard\"}");
    }
}
