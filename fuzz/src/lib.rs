//! Fuzz targets, as plain functions of the fuzzer's bytes.
//!
//! `fuzz_targets/*.rs` hand them to libFuzzer (`cargo fuzz run <target>`, nightly). The same
//! functions run as ordinary tests on stable (`cargo test` in this directory): `tests/corpus.rs`
//! feeds them the seed corpus and a deterministic stream of pseudo-random inputs, so the
//! invariants are exercised even where cargo-fuzz is not installed.
//!
//! Each target asserts more than "no panic":
//! - `stream_processor`: every event serialises to JSON that parses, accumulation works, a
//!   finished or closed processor refuses pushes, and for text input the concatenated reasoning,
//!   content and tool-call arguments and the finish reason do not depend on how the text was split;
//! - `request_json`: conversion of arbitrary bodies returns a result or an error, and a converted
//!   request renders with both encodings and encodes with the fixture tokenizer;
//! - `prompt_encoding`: prompt encoding of arbitrary text and special ranges never panics, plain
//!   encoding round-trips through decoding, and incremental decoding of arbitrary ids matches
//!   one-shot decoding regardless of grouping.

use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};
use deepring_recipe::request::chat::ChatCompletionRequest;
use deepring_recipe::request::{ConversionOptions, ParsingOptions, RequestBody, ThinkingInitialStage};
use deepring_recipe::response::{ChatCompletionResponse, ChatDelta};
use deepring_recipe::stream::{
    ChatCompletionChunkGenerator, InferenceChunk, InferenceFinishReason, MessagesChunkGenerator,
    ResponsesChunkGenerator, StreamError, StreamProcessor, TokenLogprob,
};
use deepring_recipe::{Encoding, ModelVersion, SpecialToken, SpecialTokens};
use deepring_tokenizer::{IncrementalDecoder, Tokenizer};

/// The fixture tokenizer (`$DEEPRING_TEST_TOKENIZER`, else `target/test-fixtures/…`), if built.
pub fn tokenizer() -> Option<&'static Tokenizer> {
    static T: OnceLock<Option<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| {
        let path = std::env::var("DEEPRING_TEST_TOKENIZER").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/../target/test-fixtures/deepseek-v41-tokenizer.json")
                .to_string()
        });
        Tokenizer::from_file(&path).ok()
    })
    .as_ref()
}

const PIECES: &[&str] = &[
    "</think>", "<｜DSML｜", "｜DSML｜", " calls>", "tool_calls>", "invoke name=\"", "parameter name=",
    " string=\"true\">", " string=\"false\">", "</｜DSML｜ parameter>", "</｜DSML｜ invoke>",
    "</｜DSML｜ calls>", "\n", "\n\n", "```json\n", "\n```", "{", "[", "\"", "STOP", "日本", "😀",
    "<", "</", "x", " ",
];

#[derive(Arbitrary, Debug)]
enum Chunk {
    /// Pieces of marker-rich text (indices into `PIECES`) and free text.
    Text(Vec<u8>, String, u8),
    Tokens(Vec<u32>, bool),
    Ready,
    Finish(u8),
}

#[derive(Arbitrary, Debug)]
struct StreamCase {
    protocol: u8,
    tools: bool,
    in_tools: bool,
    json: bool,
    stage: u8,
    stops: Vec<String>,
    overrides: Option<(String, String)>,
    ready: bool,
    chunks: Vec<Chunk>,
    finish: Option<u8>,
    close_early: bool,
}

fn reason(b: u8) -> InferenceFinishReason {
    match b % 3 {
        0 => InferenceFinishReason::Stop,
        1 => InferenceFinishReason::Length,
        _ => InferenceFinishReason::ContentFilter,
    }
}

fn text_of(pieces: &[u8], free: &str) -> String {
    let mut s: String = pieces
        .iter()
        .map(|&i| PIECES[i as usize % PIECES.len()])
        .collect();
    s.push_str(free);
    s
}

fn options(c: &StreamCase) -> ParsingOptions {
    let mut special = SpecialTokens::default();
    if let Some((think, dsml)) = &c.overrides {
        special = special
            .with(SpecialToken::ThinkingEnd, think.as_str())
            .with(SpecialToken::Dsml, dsml.as_str());
    }
    ParsingOptions {
        parse_tool_calls: c.tools,
        starts_in_tool_calls: c.in_tools,
        parse_json_output: c.json,
        thinking_initial_stage: match c.stage % 4 {
            1 => Some(ThinkingInitialStage::ReasoningStart),
            2 => Some(ThinkingInitialStage::ReasoningContinuation),
            3 => Some(ThinkingInitialStage::ContentContinuation),
            _ => None,
        },
        stop_sequences: c.stops.iter().take(4).cloned().collect(),
        special_tokens: special,
    }
}

/// Push `chunks`, checking the processor's contract; returns the chat chunks when `chat`.
fn drive<G: deepring_recipe::stream::ChunkGenerator>(
    mut p: StreamProcessor<G>,
    chunks: Vec<InferenceChunk>,
    finish: Option<InferenceFinishReason>,
    close_early: bool,
    json: impl Fn(&G::Event) -> String,
) -> Vec<G::Event> {
    let mut events = Vec::new();
    for chunk in chunks {
        let finished = p.finished();
        match p.push(&chunk) {
            Ok(out) => {
                assert!(!finished, "a finished processor accepted a push");
                events.extend(out);
            }
            Err(StreamError::Finished) => assert!(finished),
            Err(StreamError::Closed) => {}
            Err(StreamError::NoTokenizer) | Err(StreamError::LogprobCount { .. }) => {
                let again = p.push(&InferenceChunk::Ready {
                    prompt_usage: None,
                    system_fingerprint: None,
                });
                assert!(matches!(again, Err(StreamError::Closed)), "an error closes");
            }
        }
        if close_early {
            p.close();
        }
    }
    if let Some(r) = finish {
        if let Ok(out) = p.push(&InferenceChunk::Finish(r)) {
            events.extend(out);
        }
    }
    if let Ok(out) = p.finish() {
        events.extend(out);
    }
    for e in &events {
        let text = json(e);
        assert!(
            serde_json::from_str::<serde_json::Value>(&text).is_ok(),
            "event is not JSON: {text}"
        );
    }
    events
}

/// (reasoning, content, arguments, finish reason) of Chat chunks.
fn chat_summary(events: &[deepring_recipe::response::ChatCompletionChunk]) -> (String, String, String, Option<&'static str>) {
    let (mut r, mut c, mut a, mut f) = (String::new(), String::new(), String::new(), None);
    for e in events {
        match &e.delta {
            ChatDelta::Reasoning(t) => r.push_str(t),
            ChatDelta::Content { text, .. } => c.push_str(text),
            ChatDelta::ToolArgs { arguments, .. } => a.push_str(arguments),
            ChatDelta::ToolStart { name, .. } => a.push_str(name),
            _ => {}
        }
        f = f.or(e.finish_reason);
    }
    (r, c, a, f)
}

pub fn stream_processor(data: &[u8]) {
    let Ok(case) = StreamCase::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    let opts = options(&case);
    let tok = tokenizer().cloned();
    let mut texts = Vec::new();
    let mut text_only = true;
    let chunks: Vec<InferenceChunk> = case
        .chunks
        .iter()
        .take(64)
        .map(|c| match c {
            Chunk::Text(pieces, free, n) => {
                let content = text_of(pieces, free);
                texts.push(content.clone());
                InferenceChunk::Text { content, token_count: u64::from(*n) }
            }
            Chunk::Tokens(ids, lp) => {
                text_only = false;
                let logprobs = lp.then(|| {
                    ids.iter()
                        .map(|&i| TokenLogprob { logprob: -0.5, top_logprobs: vec![(i, -0.5), (1, -1.0)] })
                        .collect()
                });
                InferenceChunk::Tokens { token_ids: ids.clone(), logprobs }
            }
            Chunk::Ready => {
                text_only = false;
                InferenceChunk::Ready { prompt_usage: None, system_fingerprint: Some("fp".into()) }
            }
            Chunk::Finish(r) => {
                text_only = false;
                InferenceChunk::Finish(reason(*r))
            }
        })
        .collect();
    let finish = case.finish.map(reason);
    let thinking = opts.thinking_initial_stage.is_some();
    match case.protocol % 3 {
        0 => {
            let gen = || ChatCompletionChunkGenerator::new("r".into(), "m".into(), thinking, false, true);
            let events = drive(StreamProcessor::new(gen(), &opts, tok.clone()), chunks, finish, case.close_early, |e| e.to_json());
            let mut acc = ChatCompletionResponse::new("r".into(), "m".into(), 0);
            for e in &events {
                acc.accumulate(e);
            }
            assert!(serde_json::from_str::<serde_json::Value>(&acc.to_json()).is_ok());
            if text_only && !case.close_early {
                // The same text in one push: the same result.
                let whole = InferenceChunk::Text { content: texts.concat(), token_count: 0 };
                let once = drive(StreamProcessor::new(gen(), &opts, tok), vec![whole], finish, false, |e| e.to_json());
                assert_eq!(chat_summary(&events), chat_summary(&once), "chunked {texts:?}");
            }
        }
        1 => {
            let g = ResponsesChunkGenerator::new("r".into(), "m".into(), thinking).with_custom_tools(vec!["x".into()]);
            drive(StreamProcessor::new(g, &opts, tok), chunks, finish, case.close_early, |e| e.to_json());
        }
        _ => {
            let g = MessagesChunkGenerator::new("r".into(), "m".into(), thinking);
            drive(StreamProcessor::new(g, &opts, tok), chunks, finish, case.close_early, |e| e.to_json());
        }
    }
}

/// A request body: arbitrary JSON bytes, or an arbitrary JSON value built from the input.
pub fn request_json(data: &[u8]) {
    let options = ConversionOptions::default();
    let bodies: Vec<RequestBody<'_>> = match data.first() {
        Some(0) => vec![RequestBody::Value(value(&mut Unstructured::new(&data[1..]), 0))],
        _ => vec![RequestBody::Text(data)],
    };
    for body in bodies {
        // Responses and Messages conversions plug in here as they land.
        let Ok(request) = ChatCompletionRequest::from_body(body) else {
            continue;
        };
        let Ok(converted) = request.convert(&options) else {
            continue;
        };
        for version in [ModelVersion::DeepseekV4Pro, ModelVersion::DeepseekV41Flash] {
            let rendered = Encoding::new(version).render(&converted.conversation);
            if let Some(t) = tokenizer() {
                let _ = t.encode_prompt(&rendered.prompt, &rendered.special_ranges);
            }
        }
    }
}

/// A JSON value that often looks like a Chat Completions request.
fn value(u: &mut Unstructured<'_>, depth: usize) -> serde_json::Value {
    use serde_json::{json, Value};
    const KEYS: &[&str] = &[
        "model", "messages", "role", "content", "tools", "tool_choice", "type", "function", "name",
        "parameters", "arguments", "tool_calls", "id", "reasoning_content", "prefix", "stop",
        "response_format", "thinking", "max_tokens", "temperature", "top_p", "logprobs",
        "top_logprobs", "stream", "stream_options", "image_url", "url", "text", "json_schema",
        "schema", "strict", "properties", "required", "items", "enum", "anyOf", "$ref", "$defs",
    ];
    let kind = u.int_in_range(0..=9u8).unwrap_or(0);
    if depth > 6 {
        return Value::Null;
    }
    match kind {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary().unwrap_or(false)),
        2 => json!(u.arbitrary::<i64>().unwrap_or(0)),
        3 => json!(u.arbitrary::<f64>().ok().filter(|f| f.is_finite()).unwrap_or(0.5)),
        4 => Value::String(u.arbitrary::<String>().unwrap_or_default()),
        5 => Value::String(["DeepSeek-V4.1-Flash", "DeepSeek-V4-Pro", "user", "assistant", "system", "tool", "function", "auto", "required", "json_object", "object", "string"][u.int_in_range(0..=11usize).unwrap_or(0)].into()),
        6 | 7 => {
            let n = u.int_in_range(0..=4usize).unwrap_or(0);
            Value::Array((0..n).map(|_| value(u, depth + 1)).collect())
        }
        _ => {
            let n = u.int_in_range(0..=5usize).unwrap_or(0);
            let mut m = serde_json::Map::new();
            if depth == 0 {
                m.insert("model".into(), json!("DeepSeek-V4.1-Flash"));
                m.insert("messages".into(), json!([{"role": "user", "content": "hi"}]));
            }
            for _ in 0..n {
                let k = KEYS[u.int_in_range(0..=KEYS.len() - 1).unwrap_or(0)];
                m.insert(k.into(), value(u, depth + 1));
            }
            Value::Object(m)
        }
    }
}

#[derive(Arbitrary, Debug)]
struct EncodeCase {
    text: String,
    ranges: Vec<(u16, u16)>,
    ids: Vec<u32>,
    cuts: Vec<u8>,
}

pub fn prompt_encoding(data: &[u8]) {
    let Some(t) = tokenizer() else {
        return;
    };
    let Ok(case) = EncodeCase::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    let ranges: Vec<(usize, usize)> = case.ranges.iter().map(|&(a, b)| (a as usize, b as usize)).collect();
    let _ = t.encode_prompt(&case.text, &ranges);
    if let Ok(ids) = t.encode_plain(&case.text) {
        assert_eq!(t.decode(&ids), case.text, "plain encoding round-trips");
    }
    // Incremental decoding: any grouping of arbitrary ids gives the same text and count.
    let ids: Vec<u32> = case.ids.iter().map(|&i| i % (t.vocab_size() as u32 + 8)).collect();
    let run = |groups: &[&[u32]]| {
        let mut d = IncrementalDecoder::new();
        let mut pieces = Vec::new();
        for g in groups {
            d.push(t, g, &mut pieces);
        }
        d.finish();
        let text: String = pieces.iter().map(|p| p.text.as_str()).collect();
        let tokens: usize = pieces.iter().map(|p| p.tokens).sum();
        (text, tokens)
    };
    let whole = run(&[&ids]);
    let mut groups: Vec<&[u32]> = Vec::new();
    let mut rest: &[u32] = &ids;
    for &c in &case.cuts {
        if rest.is_empty() {
            break;
        }
        let (a, b) = rest.split_at(c as usize % (rest.len() + 1));
        groups.push(a);
        rest = b;
    }
    groups.push(rest);
    assert_eq!(run(&groups), whole, "grouping changed decoding");
}
