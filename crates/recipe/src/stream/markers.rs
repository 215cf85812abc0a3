//! The markers of each parser stage, as byte patterns.
//!
//! Text input spells `</think>` and `｜DSML｜` out (with the spellings of
//! `ParsingOptions.special_tokens`). Token input matches them only as special token ids, as
//! deepseek-recipe does: the decoder turns those two ids into the bytes [`THINK_END_BYTE`] /
//! [`DSML_BYTE`], which no UTF-8 text contains, so a `</think>` that the model spelled with
//! ordinary tokens stays text. A spelling that is not an added token of the tokenizer cannot
//! be produced as one id, so its markers are left out in token input.

use super::automaton::{Automaton, Pattern};
use super::matcher::MarkerKind;

/// Stand-in byte for the thinking-end special token in decoded token input.
pub(crate) const THINK_END_BYTE: u8 = 0xFE;
/// Stand-in byte for the DSML special token in decoded token input.
pub(crate) const DSML_BYTE: u8 = 0xFF;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Marker {
    /// `\n*</think>` ending the reasoning.
    ThinkEnd,
    /// A `</think>` in content: dropped.
    StrayThinkEnd,
    /// `\n*<｜DSML｜`: the tool-call block opens.
    DsmlOpen,
    /// A stop sequence (index into the options' list).
    Stop(u16),
    /// JSON output: "```" + language + newline.
    FenceOpen,
    /// JSON output: `{` or `[` starting raw JSON.
    JsonStart,
    /// JSON output: "\n```".
    FenceClose,
    /// `invoke name="`.
    Invoke,
    /// `</｜DSML｜ calls>` or `</｜DSML｜tool_calls>`.
    BlockEnd,
    /// The `"` ending a tool name.
    NameEnd,
    /// `parameter name=`.
    Parameter,
    /// `</｜DSML｜` between parameters: the invoke ends.
    InvokeEnd,
    /// The space ending a parameter name.
    KeyEnd,
    /// `string="true">`.
    StringTrue,
    /// `string="false">`.
    StringFalse,
    /// `</｜DSML｜` ending a parameter value.
    ValueEnd,
}

impl MarkerKind for Marker {
    fn absorbs_newlines(self) -> bool {
        matches!(self, Marker::ThinkEnd | Marker::DsmlOpen)
    }
}

/// Where the parser is. Each matcher stage has its own automaton.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Reasoning of a new turn: leading newlines are dropped.
    ReasoningStart,
    Reasoning,
    /// Content of a new turn (or after `</think>`): leading newlines are dropped.
    ContentStart,
    Content,
    /// JSON output mode, before the JSON.
    JsonPrefix,
    JsonFenced,
    JsonRaw,
    /// JSON output mode, after the closing fence.
    JsonSuffix,
    /// Inside `<｜DSML｜…>`, between invokes.
    ToolBlock,
    InvokeName,
    InvokeBody,
    ParamKey,
    ParamAttr,
    StringValue,
    RawValue,
    /// After the tool-call block or a stop sequence: everything is dropped.
    Done,
}

impl Stage {
    pub const COUNT: usize = 16;

    pub fn index(self) -> usize {
        self as usize
    }

    /// Stages whose markers absorb a preceding newline run.
    pub fn newline_runs(self) -> bool {
        matches!(
            self,
            Stage::Reasoning | Stage::Content | Stage::JsonPrefix | Stage::JsonSuffix
        )
    }
}

/// The byte spellings of the two special markers in one input mode (`None`: cannot occur).
#[derive(Clone, Debug)]
pub(crate) struct Spellings {
    pub think_end: Option<Vec<u8>>,
    pub dsml: Option<Vec<u8>>,
}

/// What the stage patterns depend on.
#[derive(Clone, Debug)]
pub(crate) struct MarkerConfig {
    pub tools: bool,
    pub stops: Vec<String>,
}

fn pat(tag: Marker, parts: &[&[u8]]) -> Pattern<Marker> {
    Pattern {
        bytes: parts.concat(),
        tag,
    }
}

/// The patterns of `stage` (empty for the stages that match nothing).
pub(crate) fn stage_automaton(
    stage: Stage,
    config: &MarkerConfig,
    sp: &Spellings,
) -> Automaton<Marker> {
    let mut p = Vec::new();
    let think = sp.think_end.as_deref();
    let dsml = sp.dsml.as_deref();
    let stops = |p: &mut Vec<Pattern<Marker>>| {
        for (i, s) in config.stops.iter().enumerate().take(u16::MAX as usize) {
            p.push(pat(Marker::Stop(i as u16), &[s.as_bytes()]));
        }
    };
    let dsml_open = |p: &mut Vec<Pattern<Marker>>| {
        if let (true, Some(d)) = (config.tools, dsml) {
            p.push(pat(Marker::DsmlOpen, &[b"<", d]));
        }
    };
    match stage {
        Stage::Reasoning => {
            if let Some(t) = think {
                p.push(pat(Marker::ThinkEnd, &[t]));
            }
            dsml_open(&mut p);
        }
        Stage::Content => {
            if let Some(t) = think {
                p.push(pat(Marker::StrayThinkEnd, &[t]));
            }
            dsml_open(&mut p);
            stops(&mut p);
        }
        Stage::JsonPrefix => {
            if let Some(t) = think {
                p.push(pat(Marker::StrayThinkEnd, &[t]));
            }
            dsml_open(&mut p);
            // Only these two openers start a fenced block (`jsonc`, `JSON`, `js`... are text).
            p.push(pat(Marker::FenceOpen, &[b"```json\n"]));
            p.push(pat(Marker::FenceOpen, &[b"```\n"]));
            p.push(pat(Marker::JsonStart, &[b"{"]));
            p.push(pat(Marker::JsonStart, &[b"["]));
        }
        Stage::JsonFenced | Stage::JsonRaw => {
            p.push(pat(Marker::FenceClose, &[b"\n```"]));
            stops(&mut p);
        }
        Stage::JsonSuffix => dsml_open(&mut p),
        Stage::ToolBlock => {
            p.push(pat(Marker::Invoke, &[b"invoke name=\""]));
            if let Some(d) = dsml {
                p.push(pat(Marker::BlockEnd, &[b"</", d, b" calls>"]));
                p.push(pat(Marker::BlockEnd, &[b"</", d, b"tool_calls>"]));
            }
        }
        Stage::InvokeName => p.push(pat(Marker::NameEnd, &[b"\""])),
        Stage::InvokeBody => {
            p.push(pat(Marker::Parameter, &[b"parameter name="]));
            if let Some(d) = dsml {
                p.push(pat(Marker::InvokeEnd, &[b"</", d]));
            }
        }
        Stage::ParamKey => p.push(pat(Marker::KeyEnd, &[b" "])),
        Stage::ParamAttr => {
            p.push(pat(Marker::StringTrue, &[b"string=\"true\">"]));
            p.push(pat(Marker::StringFalse, &[b"string=\"false\">"]));
        }
        Stage::StringValue | Stage::RawValue => {
            if let Some(d) = dsml {
                p.push(pat(Marker::ValueEnd, &[b"</", d]));
            }
        }
        Stage::ReasoningStart | Stage::ContentStart | Stage::Done => {}
    }
    Automaton::new(p)
}
