//! Accumulates a prompt as text plus special-token ranges (byte offsets).

use crate::conversation::{ImageSource, Message};
use crate::special::{SpecialToken, SpecialTokens};

pub(crate) struct PromptBuilder<'a> {
    pub prompt: String,
    pub ranges: Vec<(usize, usize)>,
    pub images: Vec<ImageSource>,
    pub tokens: &'a SpecialTokens,
}

impl<'a> PromptBuilder<'a> {
    pub fn new(tokens: &'a SpecialTokens, capacity: usize) -> Self {
        PromptBuilder {
            prompt: String::with_capacity(capacity),
            // A 1-turn prompt has about six special tokens: room for them without regrowing.
            ranges: Vec::with_capacity(8),
            images: Vec::new(),
            tokens,
        }
    }

    pub fn special(&mut self, token: SpecialToken) {
        let start = self.prompt.len();
        self.prompt.push_str(self.tokens.token(token));
        self.ranges.push((start, self.prompt.len()));
    }

    pub fn text(&mut self, text: &str) {
        self.prompt.push_str(text);
    }

    /// A message's content with its image placeholders as special ranges; the message's image
    /// sources are recorded in prompt order.
    pub fn content(&mut self, message: &Message) {
        let base = self.prompt.len();
        self.prompt.push_str(&message.content);
        for &(s, e) in &message.image_placeholders {
            self.ranges.push((base + s, base + e));
        }
        self.images.extend(message.image_sources.iter().cloned());
    }

    /// Expand a template: `{D}`, `{T}`, `{/T}` become special tokens, `{CALLS}` / `{INVOKE}` /
    /// `{PARAM}` the given tag names.
    pub fn template(&mut self, template: &str, tags: &DsmlTags) {
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else {
                break;
            };
            let marker = &rest[open + 1..open + close];
            let expansion = match marker {
                "D" => Some(Expansion::Special(SpecialToken::Dsml)),
                "T" => Some(Expansion::Special(SpecialToken::ThinkingStart)),
                "/T" => Some(Expansion::Special(SpecialToken::ThinkingEnd)),
                "CALLS" => Some(Expansion::Text(tags.calls)),
                "INVOKE" => Some(Expansion::Text(tags.invoke)),
                "PARAM" => Some(Expansion::Text(tags.parameter)),
                _ => None,
            };
            match expansion {
                Some(e) => {
                    self.text(&rest[..open]);
                    match e {
                        Expansion::Special(t) => self.special(t),
                        Expansion::Text(t) => self.text(t),
                    }
                    rest = &rest[open + close + 1..];
                }
                None => {
                    self.text(&rest[..=open]);
                    rest = &rest[open + 1..];
                }
            }
        }
        self.text(rest);
    }
}

enum Expansion {
    Special(SpecialToken),
    Text(&'static str),
}

/// DSML tag names of a model version.
pub(crate) struct DsmlTags {
    pub calls: &'static str,
    pub invoke: &'static str,
    pub parameter: &'static str,
}

pub(crate) const V4_TAGS: DsmlTags = DsmlTags {
    calls: "tool_calls",
    invoke: "invoke",
    parameter: "parameter",
};

pub(crate) const V41_TAGS: DsmlTags = DsmlTags {
    calls: " calls",
    invoke: " invoke",
    parameter: " parameter",
};
