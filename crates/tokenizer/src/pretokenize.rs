//! A hand-written version of the DeepSeek pre-tokenizer, for speed.
//!
//! DeepSeek's `tokenizer.json` pre-tokenizes with three regex splits (each keeping the matches
//! as pieces of their own, "Isolated") and a byte-level mapping. Through `tokenizers` this takes
//! about 80% of plain-text encoding time: regex search plus per-byte offset bookkeeping that
//! prompt encoding never reads. This module produces the same pieces with a scanner per regex
//! that tries the regex's alternatives at each position in order, as Oniguruma's leftmost-first
//! search does. Character classes come from Oniguruma itself ([`crate::charclass`]).
//!
//! It is used only for a tokenizer whose normalizer and pre-tokenizer are exactly DeepSeek's
//! ([`is_deepseek`]); any other `tokenizer.json` goes through `tokenizers` as before. Property
//! tests compare both paths on arbitrary Unicode.

use serde_json::{json, Value};

use crate::charclass::{self, CJK, LETTER, MARK, NUMBER, PUNCT, SPACE, SYMBOL};

/// The first split: runs of up to three numeric characters.
const NUMBERS: &str = r"\p{N}{1,3}";
/// The second split: runs of CJK ideographs and kana.
const IDEOGRAPHS: &str = "[一-龥぀-ゟ゠-ヿ]+";
/// The third split: words, punctuation runs, newlines and spaces.
const WORDS: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

fn isolated_split(pattern: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false})
}

/// Whether `tokenizer.json`'s normalizer and pre-tokenizer (as `tokenizers` serialises them) are
/// exactly the ones this module reproduces.
pub(crate) fn is_deepseek(normalizer: Option<Value>, pre_tokenizer: Option<Value>) -> bool {
    let plain = match normalizer {
        None | Some(Value::Null) => true,
        Some(n) => n == json!({"type": "Sequence", "normalizers": []}),
    };
    let Some(Value::Object(mut pre)) = pre_tokenizer else {
        return false;
    };
    // trim_offsets only changes offsets, never the pieces or ids.
    if let Some(Value::Array(steps)) = pre.get_mut("pretokenizers") {
        for step in steps.iter_mut() {
            if let Some(obj) = step.as_object_mut() {
                obj.remove("trim_offsets");
            }
        }
    }
    let expected = json!({
        "type": "Sequence",
        "pretokenizers": [
            isolated_split(NUMBERS),
            isolated_split(IDEOGRAPHS),
            isolated_split(WORDS),
            {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
        ],
    });
    plain && Value::Object(pre) == expected && charclass::available()
}

/// Call `emit` with each pre-tokenized piece of `text`, in order (before the byte-level mapping).
pub(crate) fn for_each_piece(text: &str, mut emit: impl FnMut(&str)) {
    isolate(text, numbers, &mut |a| {
        isolate(a, ideographs, &mut |b| isolate(b, words, &mut emit))
    });
}

/// HF `Split` with the Isolated behaviour: every match is a piece, and so is each stretch of
/// text between matches. `matcher(piece, pos)` is the end of a match starting at `pos`, if any;
/// trying positions left to right and resuming after each match is Oniguruma's `find_iter`
/// (none of these regexes matches the empty string).
fn isolate(piece: &str, matcher: fn(&str, usize) -> Option<usize>, emit: &mut dyn FnMut(&str)) {
    let mut pos = 0;
    let mut gap = 0;
    while pos < piece.len() {
        match matcher(piece, pos) {
            Some(end) => {
                if gap < pos {
                    emit(&piece[gap..pos]);
                }
                emit(&piece[pos..end]);
                pos = end;
                gap = end;
            }
            None => pos += utf8_len(piece.as_bytes()[pos]),
        }
    }
    if gap < piece.len() {
        emit(&piece[gap..]);
    }
}

#[inline]
fn utf8_len(lead: u8) -> usize {
    match lead {
        0..=0x7F => 1,
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        _ => 4,
    }
}

/// The character at `pos` with its class bits and its end, or None at the end of `s`.
#[inline]
fn at(s: &str, pos: usize) -> Option<(char, u8, usize)> {
    let c = s.get(pos..)?.chars().next()?;
    Some((c, charclass::of(c), pos + c.len_utf8()))
}

/// The end of the run of characters from `pos` whose class has a bit of `mask` (at most `max`).
#[inline]
fn run(s: &str, mut pos: usize, mask: u8, max: usize) -> usize {
    let mut n = 0;
    while n < max {
        match at(s, pos) {
            Some((_, class, end)) if class & mask != 0 => pos = end,
            _ => break,
        }
        n += 1;
    }
    pos
}

/// `\p{N}{1,3}`
fn numbers(s: &str, pos: usize) -> Option<usize> {
    let end = run(s, pos, NUMBER, 3);
    (end > pos).then_some(end)
}

/// `[一-龥぀-ゟ゠-ヿ]+`
fn ideographs(s: &str, pos: usize) -> Option<usize> {
    let end = run(s, pos, CJK, usize::MAX);
    (end > pos).then_some(end)
}

/// The alternatives of the third split, tried in the regex's order.
fn words(s: &str, pos: usize) -> Option<usize> {
    let (c0, k0, p1) = at(s, pos)?;
    let next = at(s, p1);
    // [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
    if c0.is_ascii_punctuation() {
        if let Some((c1, _, _)) = next {
            if c1.is_ascii_alphabetic() {
                let end = s[p1..]
                    .bytes()
                    .position(|b| !b.is_ascii_alphabetic())
                    .map_or(s.len(), |n| p1 + n);
                return Some(end);
            }
        }
    }
    // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+  (the optional character first, then without it)
    let optional = c0 != '\r' && c0 != '\n' && k0 & (LETTER | PUNCT | SYMBOL) == 0;
    if optional && next.is_some_and(|(_, k1, _)| k1 & (LETTER | MARK) != 0) {
        return Some(run(s, p1, LETTER | MARK, usize::MAX));
    }
    if k0 & (LETTER | MARK) != 0 {
        return Some(run(s, pos, LETTER | MARK, usize::MAX));
    }
    //  ?[\p{P}\p{S}]+[\r\n]*
    let symbols_from = if c0 == ' ' { p1 } else { pos };
    let after = run(s, symbols_from, PUNCT | SYMBOL, usize::MAX);
    if after > symbols_from {
        let newlines = s[after..]
            .bytes()
            .position(|b| b != b'\r' && b != b'\n')
            .map_or(s.len(), |n| after + n);
        return Some(newlines);
    }
    if k0 & SPACE == 0 {
        return None;
    }
    // \s*[\r\n]+ : the whitespace run up to and including its last line break.
    let mut end = pos;
    let mut last_break = None;
    let mut count = 0usize;
    let mut last_start = pos;
    while let Some((c, class, e)) = at(s, end) {
        if class & SPACE == 0 {
            break;
        }
        if c == '\r' || c == '\n' {
            last_break = Some(e);
        }
        last_start = end;
        end = e;
        count += 1;
    }
    if let Some(e) = last_break {
        return Some(e);
    }
    // \s+(?!\S) : the run, less its last character unless it reaches the end of the piece.
    if end == s.len() {
        return Some(end);
    }
    if count >= 2 {
        return Some(last_start);
    }
    // \s+
    Some(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for_each_piece(text, |p| out.push(p.to_string()));
        out
    }

    #[test]
    fn splits_like_the_regexes() {
        assert_eq!(pieces("Hello world"), ["Hello", " world"]);
        assert_eq!(pieces("12345"), ["123", "45"]);
        assert_eq!(pieces("模型abc"), ["模型", "abc"]);
        assert_eq!(pieces("a  b"), ["a", " ", " b"]);
        assert_eq!(pieces("a  \n\n  b"), ["a", "  \n\n", " ", " b"]);
        assert_eq!(pieces("x.yz"), ["x", ".yz"]);
        assert_eq!(pieces("end!!\n\nnext"), ["end", "!!\n\n", "next"]);
        assert_eq!(pieces("a \t"), ["a", " \t"]);
    }
}
