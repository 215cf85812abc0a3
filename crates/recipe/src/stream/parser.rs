//! The output parser: model output bytes in, typed pieces out.
//!
//! Stages (see [`Stage`]): reasoning, content, JSON output (prefix / fenced / raw / suffix), the
//! DSML tool-call block (block / invoke name / invoke body / parameter name / attributes /
//! string value / raw value) and done. Each stage has a marker automaton; text between markers is
//! emitted as soon as the matcher settles it, so a piece never waits for the rest of its push.
//!
//! What the stages do with text, following deepseek-recipe 0.2.0:
//! - reasoning and content are emitted as is; a stray `</think>` in content is dropped;
//! - JSON output mode replaces every run of text around the JSON by one space (the official does
//!   that once per run *per pushed chunk*, which makes the result depend on chunking; we use the
//!   result of pushing the whole output at once: recipe/DEVIATIONS.md);
//! - tool calls become argument pieces that the chunk generators render as JSON fragments: the
//!   parameter name is copied raw (it runs from `name=` to the next space, so the model's own
//!   quotes are part of it), `string="true"` values are JSON-escaped piece by piece,
//!   `string="false"` values are copied raw.

use std::sync::Arc;

use super::automaton::Automaton;
use super::markers::{
    stage_automaton, Marker, MarkerConfig, Spellings, Stage, DSML_BYTE, THINK_END_BYTE,
};
use super::matcher::{Matcher, Step};
use crate::request::{ParsingOptions, ThinkingInitialStage};
use crate::special::SpecialToken;

/// A piece of parsed output. Text pieces carry the output byte range they came from, which the
/// processor uses to attach token log probabilities.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Out {
    Reasoning {
        text: String,
        start: usize,
        end: usize,
    },
    Content {
        text: String,
        start: usize,
        end: usize,
    },
    /// A tool call whose name is complete.
    ToolStart {
        name: String,
    },
    Arg(Arg),
    /// A stop sequence matched (its index); the output ends here.
    Stop(u16),
}

/// Tool-call argument pieces, in order: `Open` (`{` or `, `), `Key`*, `KeyEnd` (`: `), then a
/// string (`StringOpen`, `Str`*, `StringClose`) or raw value (`Raw`*), …, `Close` (`}` / `{}`).
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    Open { first: bool },
    Key(String),
    KeyEnd,
    StringOpen,
    Str(String),
    StringClose,
    Raw(String),
    Close { empty: bool },
}

/// Where the output comes from: text chunks spell the special markers, token chunks produce them
/// as the stand-in bytes of [`super::markers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Text = 0,
    Tokens = 1,
}

pub(crate) struct Parser {
    config: MarkerConfig,
    spellings: [Spellings; 2],
    automata: [Vec<Option<Arc<Automaton<Marker>>>>; 2],
    mode: Mode,
    json: bool,
    stage: Stage,
    matcher: Matcher<Marker>,
    /// Held bytes (what the matcher holds back), starting at output offset `offset - held.len()`.
    held: Vec<u8>,
    /// Output bytes fed so far.
    offset: usize,
    /// JSON prefix / suffix: the current run of text already produced its space.
    spaced: bool,
    /// Parameters seen in the current invoke.
    params: usize,
    name: Vec<u8>,
    /// The start of a multi-byte character whose other bytes are still to come, and its offset:
    /// the automata settle bytes one at a time, so a byte that breaks a partial marker can be the
    /// first of a character (`<` + `｜`… of `<｜DSML｜` followed by another character).
    split_char: Vec<u8>,
    split_at: usize,
    /// Where the leading newlines a new turn drops began: their tokens' log probabilities go with
    /// the first text after them, as deepseek-recipe attaches them.
    lead: Option<usize>,
    stopped: bool,
    think_text: String,
    dsml_text: String,
}

impl Parser {
    /// `token_spellings`: the marker bytes in token input (`None` when the tokenizer lacks the
    /// special token); text input always spells them out.
    pub fn new(options: &ParsingOptions, token_spellings: Spellings) -> Self {
        let think_text = options
            .special_tokens
            .token(SpecialToken::ThinkingEnd)
            .to_string();
        let dsml_text = options.special_tokens.token(SpecialToken::Dsml).to_string();
        let text_spellings = Spellings {
            think_end: Some(think_text.as_bytes().to_vec()).filter(|s| !s.is_empty()),
            dsml: Some(dsml_text.as_bytes().to_vec()).filter(|s| !s.is_empty()),
        };
        let json = options.parse_json_output;
        let stage = if options.starts_in_tool_calls {
            Stage::ToolBlock
        } else {
            match options.thinking_initial_stage {
                Some(ThinkingInitialStage::ReasoningStart) => Stage::ReasoningStart,
                Some(ThinkingInitialStage::ReasoningContinuation) => Stage::Reasoning,
                Some(ThinkingInitialStage::ContentContinuation) if json => Stage::JsonPrefix,
                Some(ThinkingInitialStage::ContentContinuation) => Stage::Content,
                None => Stage::ContentStart,
            }
        };
        Parser {
            config: MarkerConfig {
                tools: options.parse_tool_calls,
                stops: options.stop_sequences.clone(),
            },
            spellings: [text_spellings, token_spellings],
            automata: [vec![None; Stage::COUNT], vec![None; Stage::COUNT]],
            mode: Mode::Text,
            json,
            stage,
            matcher: Matcher::new(),
            held: Vec::new(),
            offset: 0,
            spaced: false,
            params: 0,
            name: Vec::new(),
            split_char: Vec::new(),
            split_at: 0,
            lead: None,
            stopped: false,
            think_text,
            dsml_text,
        }
    }

    /// Output bytes fed so far.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// A stop sequence ended the output.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The stop sequence with index `i`.
    pub fn stop_sequence(&self, i: u16) -> &str {
        self.config
            .stops
            .get(i as usize)
            .map(String::as_str)
            .unwrap_or("")
    }

    fn automaton(&mut self, stage: Stage) -> Arc<Automaton<Marker>> {
        let mode = self.mode as usize;
        let slot = &mut self.automata[mode][stage.index()];
        match slot {
            Some(a) => Arc::clone(a),
            None => {
                let a = Arc::new(stage_automaton(stage, &self.config, &self.spellings[mode]));
                *slot = Some(Arc::clone(&a));
                a
            }
        }
    }

    /// Switch input mode. The held bytes are matched again with the other mode's markers.
    fn set_mode(&mut self, mode: Mode, out: &mut Vec<Out>) {
        if mode == self.mode {
            return;
        }
        self.mode = mode;
        self.matcher.reset();
        let held = std::mem::take(&mut self.held);
        self.offset -= held.len();
        self.feed(&held, out);
    }

    /// Parse one push of output bytes.
    pub fn push(&mut self, mode: Mode, input: &[u8], out: &mut Vec<Out>) {
        self.set_mode(mode, out);
        self.feed(input, out);
        // deepseek-recipe carries the dropped newlines' log probabilities only to text of the
        // same decoded piece: a piece of nothing but leading newlines loses them.
        if matches!(self.stage, Stage::ReasoningStart | Stage::ContentStart) {
            self.lead = None;
        }
    }

    fn feed(&mut self, input: &[u8], out: &mut Vec<Out>) {
        let mut i = 0;
        let mut stage = self.stage;
        let mut a = self.automaton(stage);
        while i < input.len() {
            if self.stage != stage {
                stage = self.stage;
                a = self.automaton(stage);
            }
            match stage {
                Stage::Done => {
                    self.offset += input.len() - i;
                    return;
                }
                Stage::ReasoningStart | Stage::ContentStart => {
                    if input[i] == b'\n' {
                        self.lead.get_or_insert(self.offset);
                        i += 1;
                        self.offset += 1;
                    } else {
                        self.stage = match stage {
                            Stage::ReasoningStart => Stage::Reasoning,
                            _ if self.json => Stage::JsonPrefix,
                            _ => Stage::Content,
                        };
                        self.spaced = false;
                    }
                    continue;
                }
                _ => {}
            }
            let runs = stage.newline_runs();
            if self.matcher.idle() {
                let start = i;
                while i < input.len() && Matcher::idle_settles(&a, runs, input[i]) {
                    i += 1;
                }
                if i > start {
                    let from = self.offset;
                    self.offset += i - start;
                    self.emit(&input[start..i], from, out);
                    continue;
                }
            }
            let b = input[i];
            i += 1;
            self.held.push(b);
            self.offset += 1;
            match self.matcher.feed(&a, runs, b) {
                Step::Hold => {}
                Step::Settle(n) => {
                    let from = self.offset - self.held.len();
                    let text: Vec<u8> = self.held.drain(..n).collect();
                    self.emit(&text, from, out);
                }
                Step::Match { text, marker, tag } => {
                    let from = self.offset - self.held.len();
                    let held = std::mem::take(&mut self.held);
                    let text = text.min(held.len());
                    self.emit(&held[..text], from, out);
                    let end = (text + marker).min(held.len());
                    self.on_marker(tag, &held[text..end], from + text, out);
                }
            }
        }
    }

    /// End of output: what is still held is text after all.
    pub fn finish(&mut self, out: &mut Vec<Out>) {
        if self.stage == Stage::Done {
            return;
        }
        let held = std::mem::take(&mut self.held);
        self.matcher.reset();
        let from = self.offset - held.len();
        self.emit(&held, from, out);
        // Cannot be left over (pushes hold whole characters); never drop bytes silently.
        let split = std::mem::take(&mut self.split_char);
        self.emit_settled(&split, self.split_at, out);
        self.stage = Stage::Done;
    }

    /// Settled text of the current stage.
    fn emit(&mut self, bytes: &[u8], mut start: usize, out: &mut Vec<Out>) {
        let joined;
        let mut bytes = bytes;
        if !self.split_char.is_empty() {
            let mut j = std::mem::take(&mut self.split_char);
            j.extend_from_slice(bytes);
            joined = j;
            bytes = &joined;
            start = self.split_at;
        }
        let cut = incomplete_tail(bytes);
        if cut < bytes.len() {
            self.split_char = bytes[cut..].to_vec();
            self.split_at = start + cut;
            bytes = &bytes[..cut];
        }
        self.emit_settled(bytes, start, out);
    }

    fn emit_settled(&mut self, bytes: &[u8], mut start: usize, out: &mut Vec<Out>) {
        if bytes.is_empty() {
            return;
        }
        let end = start + bytes.len();
        if let Some(lead) = self.lead.take() {
            start = start.min(lead);
        }
        match self.stage {
            Stage::Reasoning => out.push(Out::Reasoning {
                text: self.text(bytes),
                start,
                end,
            }),
            Stage::Content | Stage::JsonFenced | Stage::JsonRaw => out.push(Out::Content {
                text: self.text(bytes),
                start,
                end,
            }),
            Stage::JsonPrefix | Stage::JsonSuffix => {
                if !self.spaced {
                    self.spaced = true;
                    // An empty range: the space stands for no token's text, so it carries no
                    // log probabilities (the tokens of the replaced text are dropped).
                    out.push(Out::Content {
                        text: " ".to_string(),
                        start,
                        end: start,
                    });
                }
            }
            Stage::InvokeName => self.name.extend_from_slice(bytes),
            Stage::ParamKey => out.push(Out::Arg(Arg::Key(self.text(bytes)))),
            Stage::StringValue => out.push(Out::Arg(Arg::Str(self.text(bytes)))),
            Stage::RawValue => out.push(Out::Arg(Arg::Raw(self.text(bytes)))),
            Stage::ReasoningStart
            | Stage::ContentStart
            | Stage::ToolBlock
            | Stage::InvokeBody
            | Stage::ParamAttr
            | Stage::Done => {}
        }
    }

    fn on_marker(&mut self, tag: Marker, marker: &[u8], start: usize, out: &mut Vec<Out>) {
        let next = match (self.stage, tag) {
            (Stage::Reasoning, Marker::ThinkEnd) => Stage::ContentStart,
            (_, Marker::DsmlOpen) => Stage::ToolBlock,
            (stage, Marker::StrayThinkEnd) => {
                self.spaced = false;
                stage
            }
            (_, Marker::Stop(i)) => {
                self.stopped = true;
                out.push(Out::Stop(i));
                Stage::Done
            }
            (_, Marker::FenceOpen) => Stage::JsonFenced,
            (_, Marker::JsonStart) => {
                out.push(Out::Content {
                    text: self.text(marker),
                    start,
                    end: start + marker.len(),
                });
                Stage::JsonRaw
            }
            (_, Marker::FenceClose) => {
                self.spaced = false;
                Stage::JsonSuffix
            }
            (_, Marker::Invoke) => {
                self.name.clear();
                Stage::InvokeName
            }
            (_, Marker::BlockEnd) => Stage::Done,
            (_, Marker::NameEnd) => {
                let raw = std::mem::take(&mut self.name);
                let name = self.text(&raw);
                out.push(Out::ToolStart { name });
                self.params = 0;
                Stage::InvokeBody
            }
            (_, Marker::Parameter) => {
                out.push(Out::Arg(Arg::Open {
                    first: self.params == 0,
                }));
                self.params += 1;
                Stage::ParamKey
            }
            (_, Marker::InvokeEnd) => {
                out.push(Out::Arg(Arg::Close {
                    empty: self.params == 0,
                }));
                Stage::ToolBlock
            }
            (_, Marker::KeyEnd) => {
                out.push(Out::Arg(Arg::KeyEnd));
                Stage::ParamAttr
            }
            (_, Marker::StringTrue) => {
                out.push(Out::Arg(Arg::StringOpen));
                Stage::StringValue
            }
            (_, Marker::StringFalse) => Stage::RawValue,
            (Stage::StringValue, Marker::ValueEnd) => {
                out.push(Out::Arg(Arg::StringClose));
                Stage::InvokeBody
            }
            (_, Marker::ValueEnd) => Stage::InvokeBody,
            (stage, Marker::ThinkEnd) => stage,
        };
        self.stage = next;
        self.matcher.reset();
    }

    /// Output bytes as text, with the special-token stand-ins spelled out.
    fn text(&self, bytes: &[u8]) -> String {
        if !bytes.iter().any(|&b| b == THINK_END_BYTE || b == DSML_BYTE) {
            return match std::str::from_utf8(bytes) {
                Ok(s) => s.to_string(),
                // Cannot happen: pieces are settled at character boundaries. Never panic.
                Err(_) => String::from_utf8_lossy(bytes).into_owned(),
            };
        }
        let mut s = String::with_capacity(bytes.len() + 16);
        let mut rest = bytes;
        while let Some(p) = rest
            .iter()
            .position(|&b| b == THINK_END_BYTE || b == DSML_BYTE)
        {
            s.push_str(&String::from_utf8_lossy(&rest[..p]));
            s.push_str(if rest[p] == THINK_END_BYTE {
                &self.think_text
            } else {
                &self.dsml_text
            });
            rest = &rest[p + 1..];
        }
        s.push_str(&String::from_utf8_lossy(rest));
        s
    }
}

/// Where an incomplete UTF-8 sequence at the end of `bytes` starts (`bytes.len()` if none).
fn incomplete_tail(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=n.min(3) {
        let b = bytes[n - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for the lead byte
        }
        let len = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if len > back { n - back } else { n };
    }
    n
}

#[cfg(test)]
mod tests;
