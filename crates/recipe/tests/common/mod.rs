//! Test helpers: the fixture tokenizer, the recorded stream vectors, and running a stream.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use deepring_recipe::request::{ParsingOptions, ThinkingInitialStage};
use deepring_recipe::response::{
    ChatCompletionResponse, MessagesResponse, ResponsesEcho, ResponsesResponse,
};
use deepring_recipe::stream::{
    ChatCompletionChunkGenerator, ChunkGenerator, InferenceChunk, InferenceFinishReason,
    MessagesChunkGenerator, PromptUsage, ResponsesChunkGenerator, StreamProcessor,
};
use deepring_tokenizer::Tokenizer;
use serde_json::Value;

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The V4.1 fixture tokenizer (tests/README.md): `$DEEPRING_TEST_TOKENIZER`, else where
/// `./dev test` writes it.
pub fn tokenizer() -> Tokenizer {
    let path = std::env::var_os("DEEPRING_TEST_TOKENIZER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            workspace_root().join("target/test-fixtures/deepseek-v41-tokenizer.json")
        });
    assert!(
        path.exists(),
        "fixture tokenizer {} is missing: run `./dev setup` (or `./dev test`) to build it",
        path.display()
    );
    Tokenizer::from_file(path.to_str().expect("utf-8 path")).expect("fixture loads")
}

pub fn stream_vectors() -> Value {
    let path = workspace_root().join("tests/vectors/recipe-streams.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("vectors readable")).expect("JSON")
}

pub fn parsing_options(v: &Value) -> ParsingOptions {
    let stage = match v["thinking_initial_stage"].as_str() {
        Some("ReasoningStart") => Some(ThinkingInitialStage::ReasoningStart),
        Some("ReasoningContinuation") => Some(ThinkingInitialStage::ReasoningContinuation),
        Some("ContentContinuation") => Some(ThinkingInitialStage::ContentContinuation),
        _ => None,
    };
    ParsingOptions {
        parse_tool_calls: v["parse_tool_calls"].as_bool().unwrap_or(false),
        starts_in_tool_calls: v["starts_in_tool_calls"].as_bool().unwrap_or(false),
        parse_json_output: v["parse_json_output"].as_bool().unwrap_or(false),
        thinking_initial_stage: stage,
        stop_sequences: v["stop_sequences"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
        ..ParsingOptions::default()
    }
}

/// One chunk of a stream input.
#[derive(Clone, Debug)]
pub enum Input {
    Text(String, u64),
    Tokens(Vec<u32>),
}

/// Everything a run produced: (sse name, event JSON) per event, the accumulated body, and
/// whether the processor finished.
#[derive(Debug)]
pub struct Run {
    pub events: Vec<(Option<String>, Value)>,
    pub accumulated: Value,
    pub finished: bool,
}

pub enum Gen {
    Chat(ChatCompletionChunkGenerator),
    Responses(ResponsesChunkGenerator),
    Messages(MessagesChunkGenerator),
}

fn drive<G: ChunkGenerator>(
    g: G,
    options: &ParsingOptions,
    tokenizer: Option<Tokenizer>,
    ready: bool,
    inputs: &[Input],
    finish: InferenceFinishReason,
) -> (Vec<G::Event>, bool) {
    let mut p = StreamProcessor::new(g, options, tokenizer);
    let mut events = Vec::new();
    if ready {
        let usage = PromptUsage {
            prompt_tokens: 10,
            prompt_cache_hit_tokens: 3,
        };
        events.extend(
            p.push(&InferenceChunk::Ready {
                prompt_usage: Some(usage),
                system_fingerprint: Some("fp_x".into()),
            })
            .expect("ready"),
        );
    }
    for input in inputs {
        if p.finished() {
            break;
        }
        let chunk = match input {
            Input::Text(t, n) => InferenceChunk::Text {
                content: t.clone(),
                token_count: *n,
            },
            Input::Tokens(ids) => InferenceChunk::Tokens {
                token_ids: ids.clone(),
                logprobs: None,
            },
        };
        events.extend(p.push(&chunk).expect("push"));
    }
    if !p.finished() {
        events.extend(
            p.push(&InferenceChunk::Finish(finish))
                .expect("finish chunk"),
        );
    }
    events.extend(p.finish().expect("finish"));
    assert!(p.finish().expect("finish again").is_empty());
    (events, p.finished())
}

pub fn run(
    gen: Gen,
    options: &ParsingOptions,
    tokenizer: Option<Tokenizer>,
    ready: bool,
    inputs: &[Input],
    finish: InferenceFinishReason,
) -> Run {
    match gen {
        Gen::Chat(g) => {
            let (events, finished) = drive(g, options, tokenizer, ready, inputs, finish);
            let mut acc = ChatCompletionResponse::new("resp_1".into(), "model-x".into(), 0);
            for e in &events {
                acc.accumulate(e);
            }
            Run {
                events: events.iter().map(|e| (None, parse(&e.to_json()))).collect(),
                accumulated: parse(&acc.to_json()),
                finished,
            }
        }
        Gen::Responses(g) => {
            let (events, finished) = drive(g, options, tokenizer, ready, inputs, finish);
            let mut acc = ResponsesResponse::new("resp_1".into(), "model-x".into(), 0);
            for e in &events {
                acc.accumulate(e);
            }
            Run {
                events: events
                    .iter()
                    .map(|e| (Some(e.event_type().to_string()), parse(&e.to_json())))
                    .collect(),
                accumulated: parse(&acc.to_json()),
                finished,
            }
        }
        Gen::Messages(g) => {
            let (events, finished) = drive(g, options, tokenizer, ready, inputs, finish);
            let mut acc = MessagesResponse::new("resp_1".into(), "model-x".into(), 10, 3);
            for e in &events {
                acc.accumulate(e);
            }
            Run {
                events: events
                    .iter()
                    .map(|e| (Some(e.event_type().to_string()), parse(&e.to_json())))
                    .collect(),
                accumulated: parse(&acc.to_json()),
                finished,
            }
        }
    }
}

fn parse(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("event JSON does not parse ({e}): {s}"))
}

/// The echo a Responses request reports, read back from a recorded response object.
pub fn echo_from_response(r: &Value) -> ResponsesEcho {
    ResponsesEcho {
        instructions: r["instructions"].as_str().map(String::from),
        max_output_tokens: r["max_output_tokens"].as_u64(),
        temperature: r["temperature"].as_f64().unwrap_or(1.0) as f32,
        top_p: r["top_p"].as_f64().unwrap_or(1.0) as f32,
        top_logprobs: r["top_logprobs"].as_u64().unwrap_or(0),
        user: r["user"].as_str().map(String::from),
        reasoning: r["reasoning"].clone(),
        text: r["text"].clone(),
        tool_choice: r["tool_choice"].clone(),
        tools: r["tools"].clone(),
        served: Default::default(),
    }
}

/// Namespace and custom tools of a Responses request body.
pub fn responses_tools(body: &Value) -> (HashMap<String, (String, String)>, Vec<String>) {
    let mut namespaces = HashMap::new();
    let mut custom = Vec::new();
    for t in body["tools"].as_array().into_iter().flatten() {
        match t["type"].as_str() {
            Some("namespace") => {
                let ns = t["name"].as_str().unwrap_or_default().to_string();
                for f in t["tools"].as_array().into_iter().flatten() {
                    let local = f["name"].as_str().unwrap_or_default().to_string();
                    namespaces.insert(format!("{ns}::{local}"), (ns.clone(), local));
                }
            }
            Some("custom") => custom.push(t["name"].as_str().unwrap_or_default().to_string()),
            _ => {}
        }
    }
    (namespaces, custom)
}

// --- comparison ---------------------------------------------------------------------------

/// Ids and timestamps by shape: `call_NN_[ET_]<24 alnum>` -> `call_NN_[ET_]<id>`, wall-clock
/// fields -> 0.
pub fn normalise(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("created" | "created_at" | "completed_at", Value::Number(_)) => {
                            Value::from(0)
                        }
                        _ => normalise(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(normalise).collect()),
        Value::String(s) if s.starts_with("call_") => Value::String(call_shape(s)),
        other => other.clone(),
    }
}

fn call_shape(s: &str) -> String {
    let bytes = s.as_bytes();
    let ok_digits =
        s.len() >= 8 && bytes[5].is_ascii_digit() && bytes[6].is_ascii_digit() && bytes[7] == b'_';
    if !ok_digits {
        return format!("BAD:{s}");
    }
    let (prefix, tail) = if s[8..].starts_with("ET_") {
        (&s[..11], &s[11..])
    } else {
        (&s[..8], &s[8..])
    };
    let good = tail.len() == 24
        && tail.bytes().all(|b| b.is_ascii_alphanumeric())
        && tail[20..].bytes().all(|b| b.is_ascii_digit());
    if good {
        format!("{prefix}<id>")
    } else {
        format!("BAD:{s}")
    }
}

fn chat_text_key(chunk: &Value) -> Option<(String, String)> {
    if chunk.get("usage").is_some_and(|u| !u.is_null()) {
        return None;
    }
    let choice = &chunk["choices"][0];
    if !choice["finish_reason"].is_null() {
        return None;
    }
    let delta = choice["delta"].as_object()?;
    if delta.contains_key("role") {
        return None;
    }
    let mut env = chunk.clone();
    env.as_object_mut()?.remove("choices");
    let keys: Vec<&String> = delta.keys().collect();
    if let Some(calls) = delta.get("tool_calls") {
        let call = calls.get(0)?;
        if calls.as_array()?.len() != 1 || call.get("id").is_some() {
            return None;
        }
        return Some((format!("args{}{:?}", call["index"], keys), env.to_string()));
    }
    if delta.get("reasoning_content").is_some_and(Value::is_string) && delta["content"].is_null() {
        return Some((format!("reasoning{keys:?}"), env.to_string()));
    }
    if delta.get("content").is_some_and(Value::is_string)
        && delta.get("reasoning_content").is_none_or(Value::is_null)
    {
        return Some((format!("content{keys:?}"), env.to_string()));
    }
    None
}

fn chat_text(chunk: &mut Value) -> &mut Value {
    let delta = &mut chunk["choices"][0]["delta"];
    if delta.get("tool_calls").is_some() {
        return &mut delta["tool_calls"][0]["function"]["arguments"];
    }
    if delta["content"].is_null() {
        return &mut delta["reasoning_content"];
    }
    &mut delta["content"]
}

/// Consecutive deltas of one block merged, empty deltas dropped, Responses sequence numbers
/// renumbered: the form in which a stream that emits safe prefixes earlier must equal the
/// official one.
pub fn merged(protocol: &str, events: &[(Option<String>, Value)]) -> Vec<(Option<String>, Value)> {
    let mut out: Vec<(Option<String>, Value)> = Vec::new();
    let mut last_key: Option<String> = None;
    for (name, event) in events {
        let mut event = event.clone();
        let key = match protocol {
            "chat" => chat_text_key(&event).map(|(k, env)| format!("{k}|{env}")),
            "responses" => {
                let t = event["type"].as_str().unwrap_or_default();
                if t.ends_with(".delta") {
                    let mut rest = event.clone();
                    for f in ["delta", "sequence_number", "logprobs"] {
                        rest.as_object_mut().map(|o| o.remove(f));
                    }
                    Some(rest.to_string())
                } else {
                    None
                }
            }
            _ => {
                let d = &event["delta"];
                match d["type"].as_str() {
                    Some("thinking_delta" | "text_delta" | "input_json_delta")
                        if event["type"] == "content_block_delta" =>
                    {
                        Some(format!("{}{}", event["index"], d["type"]))
                    }
                    _ => None,
                }
            }
        };
        if let Some(k) = &key {
            let empty_lp = |e: &Value| match protocol {
                "chat" => e["choices"][0]["logprobs"].is_null(),
                "responses" => e["logprobs"].as_array().is_none_or(Vec::is_empty),
                _ => true,
            };
            let text = match protocol {
                "chat" => chat_text(&mut event)
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                "responses" => event["delta"].as_str().unwrap_or_default().to_string(),
                _ => {
                    let d = &event["delta"];
                    ["thinking", "text", "partial_json"]
                        .iter()
                        .find_map(|f| d[*f].as_str())
                        .unwrap_or_default()
                        .to_string()
                }
            };
            if text.is_empty() && empty_lp(&event) {
                continue;
            }
            if last_key.as_ref() == Some(k) {
                let prev = &mut out.last_mut().expect("a previous event").1;
                match protocol {
                    "chat" => {
                        let joined =
                            format!("{}{}", chat_text(prev).as_str().unwrap_or_default(), text);
                        *chat_text(prev) = Value::String(joined);
                        let lb = event["choices"][0]["logprobs"].clone();
                        let la = prev["choices"][0]["logprobs"].clone();
                        if !(la.is_null() && lb.is_null()) {
                            let field = la
                                .as_object()
                                .or(lb.as_object())
                                .and_then(|o| o.keys().next().cloned())
                                .unwrap_or_default();
                            let mut all = la[&field].as_array().cloned().unwrap_or_default();
                            all.extend(lb[&field].as_array().cloned().unwrap_or_default());
                            prev["choices"][0]["logprobs"] = serde_json::json!({ field: all });
                        }
                    }
                    "responses" => {
                        let joined =
                            format!("{}{}", prev["delta"].as_str().unwrap_or_default(), text);
                        prev["delta"] = Value::String(joined);
                        if let Some(lb) = event["logprobs"].as_array() {
                            let mut all = prev["logprobs"].as_array().cloned().unwrap_or_default();
                            all.extend(lb.iter().cloned());
                            prev["logprobs"] = Value::Array(all);
                        }
                    }
                    _ => {
                        let field = ["thinking", "text", "partial_json"]
                            .into_iter()
                            .find(|f| prev["delta"].get(*f).is_some())
                            .unwrap_or("text");
                        let joined = format!(
                            "{}{}",
                            prev["delta"][field].as_str().unwrap_or_default(),
                            text
                        );
                        prev["delta"][field] = Value::String(joined);
                    }
                }
                continue;
            }
        }
        out.push((name.clone(), event));
        last_key = key;
    }
    if protocol == "responses" {
        for (i, (_, e)) in out.iter_mut().enumerate() {
            if e.get("sequence_number").is_some() {
                e["sequence_number"] = Value::from(i as u64);
            }
        }
    }
    out.into_iter().map(|(n, e)| (n, normalise(&e))).collect()
}
