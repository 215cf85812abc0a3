//! Parallel prompt encoding == sequential encoding == Hugging Face per-segment encoding, for
//! arbitrary text, segmentations and thread counts; incremental decoding under any chunking ==
//! one-shot decoding.

mod common;

use std::sync::OnceLock;

use deepring_tokenizer::{IncrementalDecoder, Parallelism, Piece, Tokenizer, Tuning};
use proptest::prelude::*;

fn tok() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(common::tokenizer)
}

fn reference() -> &'static tokenizers::Tokenizer {
    static T: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    T.get_or_init(common::hf_plain_reference)
}

/// Fragments that stress the pre-tokenizer: digit runs, CJK, kana, emoji, combining marks,
/// whitespace runs, CRLF, punctuation glued to letters, special-token spellings.
const FRAGMENTS: &[&str] = &[
    "hello",
    " world",
    "\n",
    "\n\n",
    "\r\n",
    "  ",
    "\t",
    " \n ",
    "1234567",
    "3.14159",
    "日本語",
    "中文内容",
    "カタカナ",
    "ひらがな",
    "😀",
    "👨‍👩‍👧",
    "e\u{301}",
    "a\u{308}\u{304}",
    "def f(x):\n",
    "    return x",
    "<｜User｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
    "!!!",
    "...",
    "'s",
    ".com",
    "\u{a0}",
    "\u{2028}",
    "Ⅻ",
    "٣٤٥",
    "ÄÖÜ",
    "Привет",
    " мир",
    "\u{200b}",
    "#",
    "->",
    "\n\t\n",
];

fn text_strategy() -> impl Strategy<Value = String> {
    let fragment = prop_oneof![
        3 => proptest::sample::select(FRAGMENTS).prop_map(str::to_string),
        1 => any::<String>(),
        1 => "[a-z \\n0-9]{0,12}",
    ];
    proptest::collection::vec(fragment, 0..40).prop_map(|v| v.concat())
}

/// Characters at the edges of the pre-tokenizer's classes: every kind of whitespace and line
/// break, marks, letters of several scripts, ASCII and Unicode punctuation and symbols, numbers
/// of several scripts, ideographs at the ends of the CJK ranges, controls.
const EDGE_CHARS: &[char] = &[
    ' ',
    '\t',
    '\n',
    '\r',
    '\u{b}',
    '\u{c}',
    '\u{85}',
    '\u{a0}',
    '\u{1680}',
    '\u{2000}',
    '\u{2028}',
    '\u{2029}',
    '\u{202f}',
    '\u{3000}',
    '\u{180e}',
    '\u{200b}',
    '\u{feff}',
    'a',
    'Z',
    'é',
    'ß',
    'ж',
    'ا',
    'ה',
    'ก',
    '\u{301}',
    '\u{308}',
    '\u{93f}',
    '\u{e31}',
    '!',
    '"',
    '#',
    '-',
    '.',
    '/',
    ':',
    '@',
    '[',
    '\\',
    ']',
    '_',
    '`',
    '{',
    '~',
    '+',
    '<',
    '=',
    '$',
    '^',
    '|',
    '¡',
    '§',
    '«',
    '€',
    '©',
    '°',
    '×',
    '→',
    '。',
    '「',
    '・',
    '0',
    '9',
    '٣',
    '५',
    'Ⅻ',
    '½',
    '²',
    '①',
    '〇',
    '一',
    '龥',
    '龦',
    '\u{3040}',
    'ぁ',
    'ゟ',
    '゠',
    'ヿ',
    'ㇰ',
    '가',
    '😀',
    '\u{200d}',
    '\u{fe0f}',
    '\u{0}',
    '\u{7f}',
    '\u{1b}',
    '\u{e000}',
    '\u{10ffff}',
];

fn edge_text() -> impl Strategy<Value = String> {
    let c = prop_oneof![8 => proptest::sample::select(EDGE_CHARS), 1 => any::<char>()];
    proptest::collection::vec(c, 0..48).prop_map(|v| v.into_iter().collect())
}

fn fine() -> Tuning {
    Tuning {
        parallel_min_bytes: 0,
        min_piece_bytes: 1,
        pieces_per_thread: 64,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn parallel_equals_sequential_equals_reference(
        segments in proptest::collection::vec(text_strategy(), 1..5),
        specials in proptest::collection::vec(proptest::sample::select(vec!["<｜User｜>", "<｜Assistant｜>", "<think>"]), 4),
        threads in 1usize..5,
    ) {
        // Build prompt = seg0 S0 seg1 S1 ... with byte ranges for the specials.
        let mut prompt = String::new();
        let mut ranges = Vec::new();
        let mut expected = Vec::new();
        for (i, seg) in segments.iter().enumerate() {
            prompt.push_str(seg);
            if !seg.is_empty() {
                let ids = reference().encode(seg.as_str(), false).unwrap();
                expected.extend_from_slice(ids.get_ids());
            }
            if i + 1 < segments.len() {
                let s = specials[i % specials.len()];
                ranges.push((prompt.len(), prompt.len() + s.len()));
                prompt.push_str(s);
                expected.push(tok().added_token_id(s).unwrap());
            }
        }
        let sequential = tok().with_parallelism(Parallelism::Threads(1)).encode_prompt(&prompt, &ranges).unwrap();
        prop_assert_eq!(&sequential, &expected);
        let parallel = tok()
            .with_parallelism(Parallelism::Threads(threads))
            .encode_prompt_tuned(&prompt, &ranges, fine())
            .unwrap();
        prop_assert_eq!(&parallel, &expected);
    }

    /// The hand-written DeepSeek pre-tokenizer against the regexes run by Oniguruma.
    #[test]
    fn plain_encoding_equals_reference_on_class_edges(text in edge_text()) {
        let expected = if text.is_empty() { vec![] } else { reference().encode(text.as_str(), false).unwrap().get_ids().to_vec() };
        prop_assert_eq!(tok().encode_plain(&text).unwrap(), expected);
    }

    #[test]
    fn long_single_segment_splits_safely(text in text_strategy(), copies in 1usize..6, threads in 2usize..5) {
        let text = text.repeat(copies);
        let expected = if text.is_empty() { vec![] } else { reference().encode(text.as_str(), false).unwrap().get_ids().to_vec() };
        let got = tok()
            .with_parallelism(Parallelism::Threads(threads))
            .encode_prompt_tuned(&text, &[], fine())
            .unwrap();
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn incremental_decoding_is_chunking_invariant(
        text in text_strategy(),
        extra in proptest::collection::vec(0u32..129_300, 0..8),
        cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..10),
    ) {
        let mut ids = tok().encode(&text).unwrap();
        ids.extend(extra);
        let one_shot = decode_chunks(&[&ids[..]]);
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(ids.len() + 1)).collect();
        points.sort_unstable();
        // Chunking changes where pending bytes may be flushed by an added token, but not the text:
        // compare the concatenation and the token total of one-shot vs chunked pushes.
        let mut chunks = Vec::new();
        let mut prev = 0;
        for p in points { chunks.push(&ids[prev..p]); prev = p; }
        chunks.push(&ids[prev..]);
        let chunked = decode_chunks(&chunks);
        prop_assert_eq!(chunked, one_shot);
    }
}

/// (concatenated text, tokens accounted for) after decoding `chunks` one push each and finishing.
fn decode_chunks(chunks: &[&[u32]]) -> (String, usize) {
    let mut dec = IncrementalDecoder::new();
    let mut out: Vec<Piece> = Vec::new();
    for c in chunks {
        dec.push(tok(), c, &mut out);
    }
    dec.finish();
    (
        out.iter().map(|p| p.text.as_str()).collect(),
        out.iter().map(|p| p.tokens).sum(),
    )
}

#[test]
fn valid_text_round_trips_through_incremental_decoding() {
    let text = "Hello 日本語 😀 e\u{301} <think>x</think>";
    let ids = tok().encode(text).unwrap();
    let per_token: Vec<&[u32]> = ids.chunks(1).collect();
    assert_eq!(decode_chunks(&per_token), (text.to_string(), ids.len()));
}
