//! StreamProcessor behaviour that the recorded vectors do not pin down: partial markers never
//! leak, multi-byte characters are never split, misuse errors, usage counting.

mod common;

use deepring_recipe::request::{ParsingOptions, ThinkingInitialStage};
use deepring_recipe::response::{ChatCompletionChunk, ChatDelta};
use deepring_recipe::stream::{
    ChatCompletionChunkGenerator, InferenceChunk, InferenceFinishReason, StreamError,
    StreamProcessor, TokenLogprob,
};

fn processor(
    options: ParsingOptions,
    tokenizer: bool,
) -> StreamProcessor<ChatCompletionChunkGenerator> {
    let thinking = options.thinking_initial_stage.is_some();
    let g = ChatCompletionChunkGenerator::new("r".into(), "m".into(), thinking, false, true);
    StreamProcessor::new(g, &options, tokenizer.then(common::tokenizer))
}

fn text(s: &str) -> InferenceChunk {
    InferenceChunk::Text {
        content: s.into(),
        token_count: 1,
    }
}

/// (reasoning, content, tool call argument text) of some chunks.
fn parts(chunks: &[ChatCompletionChunk]) -> (String, String, String) {
    let (mut r, mut c, mut a) = (String::new(), String::new(), String::new());
    for chunk in chunks {
        match &chunk.delta {
            ChatDelta::Reasoning(t) => r.push_str(t),
            ChatDelta::Content { text, .. } => c.push_str(text),
            ChatDelta::ToolArgs { arguments, .. } => a.push_str(arguments),
            _ => {}
        }
    }
    (r, c, a)
}

fn options(f: impl FnOnce(&mut ParsingOptions)) -> ParsingOptions {
    let mut o = ParsingOptions {
        parse_tool_calls: false,
        ..ParsingOptions::default()
    };
    f(&mut o);
    o
}

#[test]
fn partial_markers_never_leak() {
    let reasoning =
        || options(|o| o.thinking_initial_stage = Some(ThinkingInitialStage::ReasoningStart));
    let cases: Vec<(ParsingOptions, &str, (&str, &str))> = vec![
        // (options, marker, (reasoning, content) after "x" + marker + "y")
        (reasoning(), "</think>", ("x", "y")),
        (
            options(|o| o.stop_sequences = vec!["STOP".into()]),
            "STOP",
            ("", "x"),
        ),
        (
            options(|o| o.stop_sequences = vec!["\n\n\n".into()]),
            "\n\n\n",
            ("", "x"),
        ),
        (options(|_| {}), "</think>", ("", "xy")),
        (
            options(|o| o.parse_tool_calls = true),
            "\n\n<｜DSML｜ calls>",
            ("", "x"),
        ),
        (
            options(|o| o.parse_json_output = true),
            "```json\n",
            ("", " y"),
        ),
    ];
    for (opts, marker, (want_r, want_c)) in cases {
        let chars: Vec<(usize, char)> = marker.char_indices().collect();
        for &(cut, _) in chars.iter().skip(1) {
            let mut p = processor(opts.clone(), false);
            let first = p
                .push(&text(&format!("x{}", &marker[..cut])))
                .expect("push");
            let (r, c, _) = parts(&first);
            let shown = format!("{r}{c}");
            // Nothing of the partial marker is out yet ("x" itself may be, or its JSON space).
            assert!(
                shown == "x" || shown.is_empty() || shown == " ",
                "{marker:?} cut {cut}: {shown:?}"
            );
            let mut all = first;
            all.extend(
                p.push(&text(&format!("{}y", &marker[cut..])))
                    .expect("push"),
            );
            if !p.finished() {
                all.extend(p.finish().expect("finish"));
            }
            let (r, c, _) = parts(&all);
            assert_eq!(
                (r.as_str(), c.as_str()),
                (want_r, want_c),
                "{marker:?} cut {cut}"
            );
        }
    }
}

#[test]
fn multi_byte_characters_are_never_split() {
    let tok = common::tokenizer();
    let text = "日本😀é👨\u{200d}👩 x";
    let ids = tok.encode(text).expect("encodes");
    let mut byte_ids = Vec::new();
    for id in ids {
        for b in tok.token_bytes(id).expect("known id") {
            let single = (0..tok.vocab_size() as u32)
                .find(|&i| tok.token_bytes(i) == Some(&[*b][..]) && !tok.is_added(i))
                .expect("byte token");
            byte_ids.push(single);
        }
    }
    let mut p = processor(options(|_| {}), true);
    let mut all = Vec::new();
    for id in &byte_ids {
        let chunk = InferenceChunk::Tokens {
            token_ids: vec![*id],
            logprobs: None,
        };
        let events = p.push(&chunk).expect("push");
        for e in &events {
            if let ChatDelta::Content { text, .. } = &e.delta {
                assert!(!text.contains('\u{FFFD}'), "{text:?}");
            }
        }
        all.extend(events);
    }
    all.extend(p.finish().expect("finish"));
    assert_eq!(parts(&all).1, text);
    let usage = all.last().and_then(|c| c.usage).expect("usage");
    assert_eq!(usage.completion_tokens, byte_ids.len() as u64);
}

#[test]
fn an_incomplete_tail_is_dropped_but_counted() {
    let tok = common::tokenizer();
    // 3574 is the first two bytes of a four-byte character.
    let mut p = processor(options(|_| {}), true);
    let mut all = p
        .push(&InferenceChunk::Tokens {
            token_ids: vec![33, 3574],
            logprobs: None,
        })
        .expect("push");
    all.extend(p.finish().expect("finish"));
    assert_eq!(parts(&all).1, tok.decode(&[33]));
    assert_eq!(
        all.last()
            .and_then(|c| c.usage)
            .map(|u| u.completion_tokens),
        Some(2)
    );
}

#[test]
fn misuse_errors_match_the_official_messages() {
    let mut p = processor(options(|_| {}), false);
    let e = p
        .push(&InferenceChunk::Tokens {
            token_ids: vec![1],
            logprobs: None,
        })
        .expect_err("no tokenizer");
    assert_eq!(e.to_string(), "token chunk received without a tokenizer");
    // A stream error closes the processor.
    assert_eq!(p.push(&text("x")), Err(StreamError::Closed));
    assert_eq!(p.finish(), Err(StreamError::Closed));
    assert!(!p.finished());

    let mut p = processor(options(|_| {}), true);
    let lp = TokenLogprob {
        logprob: -1.0,
        top_logprobs: vec![],
    };
    let e = p
        .push(&InferenceChunk::Tokens {
            token_ids: vec![1, 2],
            logprobs: Some(vec![lp]),
        })
        .expect_err("count mismatch");
    assert_eq!(
        e.to_string(),
        "invalid log probabilities: 1 log probabilities for 2 token IDs"
    );

    let mut p = processor(options(|o| o.stop_sequences = vec!["STOP".into()]), false);
    p.push(&text("a STOP b")).expect("push");
    assert!(p.finished());
    assert_eq!(
        p.push(&InferenceChunk::Finish(InferenceFinishReason::Stop)),
        Err(StreamError::Finished)
    );
    assert_eq!(p.finish(), Ok(vec![]));
    p.close();
    assert!(!p.finished());
    assert_eq!(p.finish(), Err(StreamError::Closed));
    assert_eq!(
        StreamError::Finished.to_string(),
        "stream processor has finished"
    );
    assert_eq!(
        StreamError::Closed.to_string(),
        "stream processor is closed"
    );
}

#[test]
fn stop_sequence_ends_counting_at_the_piece_that_holds_it() {
    let tok = common::tokenizer();
    // Pieces break at special tokens: "Hello STOP more " | EOS | " text".
    let ids = tok
        .encode("Hello STOP more <｜end▁of▁sentence｜> text")
        .expect("encodes");
    let eos = ids.iter().position(|&i| i == 1).expect("eos");
    let mut p = processor(options(|o| o.stop_sequences = vec!["STOP".into()]), true);
    let events = p
        .push(&InferenceChunk::Tokens {
            token_ids: ids,
            logprobs: None,
        })
        .expect("push");
    let usage = events.last().and_then(|c| c.usage).expect("usage");
    assert_eq!(usage.completion_tokens, eos as u64);
    assert_eq!(parts(&events).1, "Hello ");
}

#[test]
fn long_reasoning_is_counted_exactly_in_the_background() {
    let tok = common::tokenizer();
    let sentence =
        "Thinking about <｜User｜> tokens, 日本語の文 and numbers 12345.\nNext line here. ";
    let reasoning: String = sentence.repeat(400);
    let opts = options(|o| o.thinking_initial_stage = Some(ThinkingInitialStage::ReasoningStart));
    let mut p = processor(opts, true);
    let mut events = Vec::new();
    for word in reasoning.split_inclusive(' ') {
        events.extend(p.push(&text(word)).expect("push"));
    }
    events.extend(p.push(&text("</think>done")).expect("push"));
    events.extend(p.finish().expect("finish"));
    let (r, c, _) = parts(&events);
    assert!(
        r == reasoning && c == "done",
        "reasoning or content differs"
    );
    let usage = events.last().and_then(|e| e.usage).expect("usage");
    let want = tok.encode(r.as_str()).expect("encodes").len() as u64;
    assert_eq!(usage.reasoning_tokens, Some(want));
}
