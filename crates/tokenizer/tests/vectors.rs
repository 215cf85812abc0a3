//! Token ids of every recorded request vector (deepseek-recipe 0.2.0, both encodings).

mod common;

use deepring_tokenizer::{Parallelism, Tokenizer, Tuning};

#[test]
fn recorded_prompts_encode_to_recorded_ids() {
    let tok = common::tokenizer();
    let vectors = common::request_vectors();
    let mut checked = 0;
    for case in vectors["cases"].as_array().expect("cases") {
        let Some(rendered) = case.get("rendered").and_then(|r| r.as_object()) else {
            continue;
        };
        for (version, r) in rendered {
            let Some(ids) = r.get("token_ids").and_then(|v| v.as_array()) else {
                continue;
            };
            let prompt = r["prompt"].as_str().expect("prompt");
            let ranges: Vec<(usize, usize)> = r["special_ranges"]
                .as_array()
                .expect("ranges")
                .iter()
                .map(|p| {
                    (
                        p[0].as_u64().unwrap() as usize,
                        p[1].as_u64().unwrap() as usize,
                    )
                })
                .collect();
            let ranges = common::char_to_byte_ranges(prompt, &ranges);
            let expected: Vec<u32> = ids.iter().map(|v| v.as_u64().unwrap() as u32).collect();
            for threads in [1, 2, 3] {
                let t = tok.with_parallelism(Parallelism::Threads(threads));
                let fine = Tuning {
                    parallel_min_bytes: 0,
                    min_piece_bytes: 1,
                    pieces_per_thread: 64,
                };
                let got = t
                    .encode_prompt_tuned(prompt, &ranges, fine)
                    .expect("encodes");
                assert_eq!(
                    got, expected,
                    "case {} {version} threads {threads}",
                    case["id"]
                );
            }
            assert_eq!(r["n_tokens"].as_u64(), Some(expected.len() as u64));
            checked += 1;
        }
    }
    assert!(checked >= 90, "only {checked} prompts had recorded ids");
}

#[test]
fn missing_special_token_is_an_error_naming_it() {
    let tok = common::tokenizer();
    let prompt = "<｜Nope｜>x";
    let err = tok
        .encode_prompt(prompt, &[(0, "<｜Nope｜>".len())])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "special token \"<｜Nope｜>\" is not in the added vocabulary"
    );
}

#[test]
fn ranges_off_char_boundaries_are_rejected() {
    let tok = common::tokenizer();
    assert!(tok.encode_prompt("日本", &[(1, 3)]).is_err());
    assert!(tok.encode_prompt("ab", &[(1, 1)]).is_err());
    assert!(tok.encode_prompt("ab", &[(0, 5)]).is_err());
}

#[test]
fn full_vocabulary_encode_matches_special_spellings() {
    let tok = common::tokenizer();
    let ids = tok.encode("a<｜User｜>b").unwrap();
    assert!(ids.contains(&128803), "{ids:?}");
    let plain = tok.encode_plain("a<｜User｜>b").unwrap();
    assert!(!plain.contains(&128803), "{plain:?}");
}

#[test]
fn count_tokens_equals_full_vocabulary_encode() {
    let tok = common::tokenizer();
    let long = "The model reasons in English, 中文，和日本語の文。 ".repeat(200);
    for text in [
        "",
        "plain text without specials",
        "a<｜User｜>b",
        "x</think>y",
        "｜DSML｜ invoke",
        "<｜end▁of▁sentence｜> and more",
        "fullwidth，commas：and（brackets）",
        long.as_str(),
    ] {
        assert_eq!(
            tok.count_tokens(text).unwrap(),
            tok.encode(text).unwrap().len(),
            "{text:?}"
        );
    }
}

#[test]
fn counting_the_parts_at_safe_cuts_counts_the_whole() {
    let tok = common::tokenizer();
    let text = "Some words here, 中文和日本語。\nA new line <｜User｜> more words 123456 end.\n"
        .repeat(300);
    let whole = tok.encode(&text).unwrap().len();
    let mut rest = text.as_str();
    let mut pending = Vec::new();
    while let Some(cut) = deepring_tokenizer::Tokenizer::safe_cut(rest, 1000) {
        pending.push(tok.count_tokens_in_background(rest[..cut].to_string()));
        rest = &rest[cut..];
    }
    assert!(pending.len() > 5);
    let parts: usize =
        pending.into_iter().map(|p| p.wait()).sum::<usize>() + tok.count_tokens(rest).unwrap();
    assert_eq!(parts, whole);
}

/// A tokenizer whose pre-tokenizer is not exactly DeepSeek's takes the `tokenizers` path: with
/// digit groups of two instead of three, "12345" splits as 12|34|5, which the hand-written
/// DeepSeek pre-tokenizer would get wrong.
#[test]
fn other_pre_tokenizers_are_not_taken_for_deepseek() {
    let text = std::fs::read_to_string(common::tokenizer_path()).expect("fixture readable");
    let mut json: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}{1,2}".into();
    let ours = Tokenizer::from_json(&json.to_string()).expect("loads");
    json["added_tokens"] = serde_json::Value::Array(vec![]);
    let reference: tokenizers::Tokenizer = json.to_string().parse().expect("reference loads");
    for sample in ["12345", "a 1234567 b", "x = 98765;\n"] {
        let want = reference.encode(sample, false).expect("encodes");
        assert_eq!(
            ours.encode_plain(sample).expect("encodes"),
            want.get_ids(),
            "{sample:?}"
        );
        assert_ne!(
            common::tokenizer().encode_plain(sample).expect("encodes"),
            want.get_ids()
        );
    }
}
