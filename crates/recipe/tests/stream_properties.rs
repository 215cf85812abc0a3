//! Properties of stream processing over generated model outputs:
//!
//! - any chunking (whole, per character, random splits, one token id per push, random groups of
//!   ids, one UTF-8 byte token per push) gives the same events (consecutive deltas merged) and
//!   the same accumulated response as pushing the whole output at once; usage too, among
//!   chunkings that account for the same tokens;
//!   (Emitting part of a marker too early would break this: the whole output matches it.
//!   `processor_tests.rs` pushes every proper prefix of every marker explicitly.)
//! - multi-byte characters are never split: no U+FFFD appears that the output did not contain.
//!
//! Cases: `PROPTEST_CASES` (default 256).

mod common;

use std::sync::OnceLock;

use common::{merged, run, Gen, Input, Run};
use deepring_recipe::request::{ParsingOptions, ThinkingInitialStage};
use deepring_recipe::stream::{
    ChatCompletionChunkGenerator, InferenceFinishReason, MessagesChunkGenerator,
    ResponsesChunkGenerator,
};
use deepring_tokenizer::Tokenizer;
use proptest::prelude::*;
use serde_json::Value;

const FRAGMENTS: &[&str] = &[
    "Hello",
    " world",
    "\n",
    "\n\n",
    " ",
    "Let me think.",
    "</th",
    "</think>",
    "</",
    "<",
    "<｜",
    "<｜DSML",
    "｜DSML｜",
    "<think>",
    "```",
    "```json\n",
    "\n```",
    "{",
    "}",
    "[1, 2]",
    "\"",
    "\\",
    "日本語",
    "é",
    "😀",
    "👨\u{200d}👩\u{200d}👧",
    "\u{2028}",
    "\t",
    "json",
    "<｜end▁of▁sentence｜>",
    "ST",
    "STOP",
    "OP",
    "</answer>",
    "。",
    "ab",
];
const STOPS: &[&str] = &["STOP", "\n\n\n", "</answer>", "。", "ab"];
const NAMES: &[&str] = &["get_weather", "search", "f", "日本"];

struct Fixture {
    tokenizer: Tokenizer,
    /// Single-byte token of each byte value.
    byte_ids: Vec<u32>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let tokenizer = common::tokenizer();
        let mut byte_ids = vec![u32::MAX; 256];
        for id in 0..tokenizer.vocab_size() as u32 {
            if let Some([b]) = tokenizer.token_bytes(id) {
                if !tokenizer.is_added(id) && byte_ids[*b as usize] == u32::MAX {
                    byte_ids[*b as usize] = id;
                }
            }
        }
        Fixture {
            tokenizer,
            byte_ids,
        }
    })
}

fn param() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        "[a-z日😀\"\\\\ \n]{0,6}",
        Just("42".to_string()),
        Just("{\"a\": [1, null]}".to_string()),
        Just("not json".to_string()),
    ];
    (
        prop::sample::select(vec!["city", "days", "q", "日本", "a\"b", ""]),
        prop::sample::select(vec!["true", "false", "maybe"]),
        value,
        any::<bool>(),
    )
        .prop_map(|(name, flag, value, v41)| {
            let tag = if v41 { " parameter" } else { "parameter" };
            format!("<｜DSML｜{tag} name=\"{name}\" string=\"{flag}\">{value}</｜DSML｜{tag}>\n")
        })
}

fn tool_block() -> impl Strategy<Value = String> {
    let invoke = (
        prop::sample::select(NAMES.to_vec()),
        prop::collection::vec(param(), 0..3),
        any::<bool>(),
    )
        .prop_map(|(name, params, v41)| {
            let tag = if v41 { " invoke" } else { "invoke" };
            format!(
                "<｜DSML｜{tag} name=\"{name}\">\n{}</｜DSML｜{tag}>\n",
                params.concat()
            )
        });
    (
        prop::sample::select(vec!["", "\n", "\n\n"]),
        prop::collection::vec(invoke, 1..3),
        any::<bool>(),
    )
        .prop_map(|(lead, invokes, v41)| {
            let tag = if v41 { " calls" } else { "tool_calls" };
            format!(
                "{lead}<｜DSML｜{tag}>\n{}</｜DSML｜{tag}>",
                invokes.concat()
            )
        })
}

fn output() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => prop::sample::select(FRAGMENTS.to_vec()).prop_map(String::from),
        2 => "[a-zA-Z0-9 日本😀é\n<>/{}`]{0,6}",
        1 => tool_block(),
    ];
    prop::collection::vec(piece, 0..10).prop_map(|v| v.concat())
}

#[derive(Clone, Debug)]
struct Setup {
    protocol: usize,
    options: ParsingOptions,
    finish: InferenceFinishReason,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        0usize..3,
        any::<bool>(),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.1),
        0usize..4,
        prop::sample::subsequence(STOPS.to_vec(), 0..=2),
        0usize..3,
    )
        .prop_map(|(protocol, tools, json, in_tools, stage, stops, finish)| {
            let stage = match stage {
                1 => Some(ThinkingInitialStage::ReasoningStart),
                2 => Some(ThinkingInitialStage::ReasoningContinuation),
                3 => Some(ThinkingInitialStage::ContentContinuation),
                _ => None,
            };
            Setup {
                protocol,
                options: ParsingOptions {
                    parse_tool_calls: tools,
                    starts_in_tool_calls: tools && in_tools,
                    parse_json_output: json,
                    thinking_initial_stage: stage,
                    stop_sequences: stops.into_iter().map(String::from).collect(),
                    ..ParsingOptions::default()
                },
                finish: [
                    InferenceFinishReason::Stop,
                    InferenceFinishReason::Length,
                    InferenceFinishReason::ContentFilter,
                ][finish],
            }
        })
}

fn generator(s: &Setup) -> (Gen, &'static str) {
    let thinking = s.options.thinking_initial_stage.is_some();
    let (id, model) = ("resp_1".to_string(), "model-x".to_string());
    match s.protocol {
        0 => {
            let continuation =
                s.options.thinking_initial_stage == Some(ThinkingInitialStage::ContentContinuation);
            let g = ChatCompletionChunkGenerator::new(id, model, thinking, continuation, true);
            (Gen::Chat(g), "chat")
        }
        1 => {
            let g = ResponsesChunkGenerator::new(id, model, thinking)
                .with_custom_tools(vec!["f".into()]);
            (Gen::Responses(g), "responses")
        }
        _ => (
            Gen::Messages(MessagesChunkGenerator::new(id, model, thinking)),
            "messages",
        ),
    }
}

/// Text pieces split at `cuts` (fractions), each accounting for its characters as tokens.
fn text_pieces(text: &str, cuts: &[f64]) -> Vec<Input> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| {
            chars
                .get((c * chars.len() as f64) as usize)
                .map_or(text.len(), |x| x.0)
        })
        .collect();
    points.push(0);
    points.push(text.len());
    points.sort_unstable();
    points.dedup();
    points
        .windows(2)
        .map(|w| {
            let s = &text[w[0]..w[1]];
            Input::Text(s.to_string(), s.chars().count() as u64)
        })
        .collect()
}

fn groups(ids: &[u32], cuts: &[f64]) -> Vec<Input> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| (c * ids.len() as f64) as usize)
        .collect();
    points.push(0);
    points.push(ids.len());
    points.sort_unstable();
    points.dedup();
    points
        .windows(2)
        .map(|w| Input::Tokens(ids[w[0]..w[1]].to_vec()))
        .collect()
}

fn strip_usage(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = if k == "usage" && !v.is_null() {
                        Value::String("<usage>".into())
                    } else {
                        strip_usage(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_usage).collect()),
        other => other.clone(),
    }
}

/// The chunking-independent view of a run.
fn view(protocol: &str, r: &Run, keep_usage: bool) -> Value {
    let events: Vec<Value> = merged(protocol, &r.events)
        .into_iter()
        .map(|(n, e)| serde_json::json!([n, e]))
        .collect();
    let v = serde_json::json!({
        "events": events,
        "accumulated": common::normalise(&r.accumulated),
        "finished": r.finished,
    });
    if keep_usage {
        v
    } else {
        strip_usage(&v)
    }
}

/// Reasoning and content text of a run's events (chat, responses or messages).
fn texts(r: &Run) -> Vec<String> {
    let mut out = Vec::new();
    for (_, e) in &r.events {
        let d = &e["choices"][0]["delta"];
        for f in ["content", "reasoning_content"] {
            if let Some(s) = d[f].as_str() {
                out.push(s.to_string());
            }
        }
        if let Some(t) = e["type"].as_str() {
            if t == "response.output_text.delta" || t == "response.reasoning_text.delta" {
                out.push(e["delta"].as_str().unwrap_or_default().to_string());
            }
        }
        for f in ["text", "thinking"] {
            if let Some(s) = e["delta"][f].as_str() {
                out.push(s.to_string());
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn chunking_does_not_change_the_result(
        s in setup(),
        text in output(),
        cuts in prop::collection::vec(0.0f64..1.0, 0..8),
        id_cuts in prop::collection::vec(0.0f64..1.0, 0..6),
    ) {
        let f = fixture();
        let ids = f.tokenizer.encode(&text).expect("encodes");
        let bytes: Vec<u32> = ids
            .iter()
            .flat_map(|&id| match f.tokenizer.token_bytes(id) {
                Some(b) if !f.tokenizer.is_added(id) => {
                    b.iter().map(|&b| f.byte_ids[b as usize]).collect::<Vec<_>>()
                }
                _ => vec![id],
            })
            .collect();
        let chunkings: Vec<(&str, &str, Vec<Input>)> = vec![
            ("whole", "text", text_pieces(&text, &[])),
            ("chars", "text", text_pieces(&text, &(0..text.chars().count()).map(|i| i as f64 / text.chars().count().max(1) as f64).collect::<Vec<_>>())),
            ("random", "text", text_pieces(&text, &cuts)),
            ("tokens", "ids", ids.iter().map(|&i| Input::Tokens(vec![i])).collect()),
            ("groups", "ids", groups(&ids, &id_cuts)),
            ("bytes", "bytes", bytes.iter().map(|&i| Input::Tokens(vec![i])).collect()),
        ];
        let mut first: std::collections::HashMap<&str, (Value, bool)> = Default::default();
        let mut base: Option<Value> = None;
        let mut base_text: Option<Value> = None;
        for (name, class, inputs) in chunkings {
            let (gen, protocol) = generator(&s);
            let tokenizer = if class == "text" { None } else { Some(f.tokenizer.clone()) };
            let r = run(gen, &s.options, tokenizer, true, &inputs, s.finish);
            // Leaks and split characters.
            if !text.contains('\u{FFFD}') {
                for t in texts(&r) {
                    prop_assert!(!t.contains('\u{FFFD}'), "{name}: U+FFFD in {t:?}");
                }
            }
            // Within one input kind, everything but usage; within one usage class, usage too
            // (unless a stop sequence ended the run inside a push).
            let stopped = !s.options.stop_sequences.is_empty();
            let v = view(protocol, &r, true);
            let no_usage = view(protocol, &r, false);
            let kind = if class == "text" { "text" } else { "ids" };
            match first.get(class) {
                Some((want, want_stopped)) if !stopped && !*want_stopped => {
                    prop_assert_eq!(&v, want, "{} vs first of class {}", name, class)
                }
                Some(_) => {}
                None => {
                    first.insert(class, (v, stopped));
                }
            }
            if kind == "text" {
                match &base_text {
                    Some(want) => prop_assert_eq!(&no_usage, want, "{} vs whole", name),
                    None => base_text = Some(no_usage),
                }
            } else {
                match &base {
                    Some(want) => prop_assert_eq!(&no_usage, want, "{} vs tokens", name),
                    None => base = Some(no_usage),
                }
            }
        }
    }
}
