//! What a chunk generator is: it turns parsed output pieces into one protocol's events.

use super::parser::Arg;
use super::TokenLogprobs;
use crate::response::json;
use crate::response::Usage;

/// How the output ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending<'a> {
    Stop,
    Length,
    ContentFilter,
    /// A stop sequence matched (the sequence).
    StopSequence(&'a str),
}

/// Prompt-side facts the first events report.
#[derive(Clone, Debug, Default)]
pub struct StartInfo {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub system_fingerprint: Option<String>,
}

/// One protocol's event stream. The processor calls `start` once (on `ready` or the first
/// output), then the piece methods in output order, then `finish` once.
pub trait ChunkGenerator: Send {
    type Event: Send;

    fn start(&mut self, info: &StartInfo, out: &mut Vec<Self::Event>);
    fn reasoning(
        &mut self,
        text: String,
        logprobs: Option<Vec<TokenLogprobs>>,
        out: &mut Vec<Self::Event>,
    );
    fn content(
        &mut self,
        text: String,
        logprobs: Option<Vec<TokenLogprobs>>,
        out: &mut Vec<Self::Event>,
    );
    fn tool_start(&mut self, name: String, out: &mut Vec<Self::Event>);
    /// Argument pieces of the current call, in order (one push's worth at a time).
    fn tool_args(&mut self, args: &[Arg], out: &mut Vec<Self::Event>);
    fn finish(&mut self, ending: Ending<'_>, usage: Usage, out: &mut Vec<Self::Event>);
}

/// The JSON fragments of argument pieces, as deepseek-recipe streams them: `{` / `, ` before a
/// parameter, the raw parameter name, `: `, `"` + escaped string + `"` or the raw value, `}`.
pub(crate) fn render_args(args: &[Arg], out: &mut String) {
    for a in args {
        match a {
            Arg::Open { first: true } => out.push('{'),
            Arg::Open { first: false } => out.push_str(", "),
            Arg::Key(k) => out.push_str(k),
            Arg::KeyEnd => out.push_str(": "),
            Arg::StringOpen | Arg::StringClose => out.push('"'),
            Arg::Str(s) => json::escaped(out, s),
            Arg::Raw(r) => out.push_str(r),
            Arg::Close { empty: true } => out.push_str("{}"),
            Arg::Close { empty: false } => out.push('}'),
        }
    }
}
