//! Test helpers: the fixture tokenizer and the recorded vectors.
#![allow(dead_code)]

use std::path::PathBuf;

use deepring_tokenizer::Tokenizer;

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Path of the V4.1 fixture tokenizer (tests/README.md): `$DEEPRING_TEST_TOKENIZER`, else the
/// place `./dev test` writes it to.
pub fn tokenizer_path() -> PathBuf {
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
    path
}

pub fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(tokenizer_path().to_str().expect("utf-8 path")).expect("fixture loads")
}

/// The same vocabulary as an independent Hugging Face tokenizer with the added vocabulary removed:
/// its `encode` is the reference for plain-segment encoding.
pub fn hf_plain_reference() -> tokenizers::Tokenizer {
    let text = std::fs::read_to_string(tokenizer_path()).expect("fixture readable");
    let mut json: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    json["added_tokens"] = serde_json::Value::Array(vec![]);
    json.to_string().parse().expect("reference loads")
}

pub fn request_vectors() -> serde_json::Value {
    let path = workspace_root().join("tests/vectors/recipe-requests.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("vectors readable")).expect("JSON")
}

/// Python code-point offsets -> byte offsets.
pub fn char_to_byte_ranges(text: &str, ranges: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut starts: Vec<usize> = text.char_indices().map(|(b, _)| b).collect();
    starts.push(text.len());
    ranges
        .iter()
        .map(|&(s, e)| (starts[s], starts[e]))
        .collect()
}
