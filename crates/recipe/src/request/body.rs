//! Request bodies: JSON text (str / bytes) or an already-built JSON value (from a Python dict).

use serde::de::value::{BorrowedStrDeserializer, StringDeserializer};
use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::de::StrRead;
use serde_json::Value;

use crate::error::RecipeError;

pub enum RequestBody<'a> {
    Text(&'a [u8]),
    Value(Value),
}

/// Parse a body into a protocol request type. JSON syntax errors read `invalid JSON request: ...`
/// (with the position); shape errors `invalid request body: ...` (without, as the body is read
/// through a JSON value first, as deepseek-recipe does).
pub fn parse_body<T: DeserializeOwned>(body: RequestBody<'_>) -> Result<T, RecipeError> {
    parse_body_boxed(body).map(|request| *request)
}

/// [`parse_body`], boxed as soon as it is read: a request is a few hundred bytes, and on its way
/// to a Python object it passes through a dozen results and wrappers, each a copy unless it is
/// a pointer (the copies were a tenth of a 1-turn request's time).
pub fn parse_body_boxed<T: DeserializeOwned>(body: RequestBody<'_>) -> Result<Box<T>, RecipeError> {
    if let RequestBody::Text(bytes) = &body {
        // Fast path: text straight into the typed request, without building a JSON value first
        // (about half the parse time). Any failure is reported by the path through a value,
        // whose messages are the official's (shape errors without a position; a duplicated key
        // is not an error there, the last one wins).
        if let Some(request) = read_fast(bytes, |de| T::deserialize(de).map(Box::new)) {
            return Ok(request);
        }
    }
    parse_value(body).map(Box::new)
}

/// The path through a JSON value, whose messages are the official's.
pub(crate) fn parse_value<T: DeserializeOwned>(body: RequestBody<'_>) -> Result<T, RecipeError> {
    serde_json::from_value(to_value(body)?)
        .map_err(|e| RecipeError::InvalidBody(format!("invalid request body: {e}")))
}

/// Run `read` over JSON text, as `serde_json::from_slice` does, when the text is one the typed
/// fast path may read (see [`fast_path_safe`]); `None` when it is not or on any error, which the
/// caller then reports through the path through a value.
pub(crate) fn read_fast<T>(
    bytes: &[u8],
    read: impl FnOnce(&mut serde_json::Deserializer<StrRead<'_>>) -> serde_json::Result<T>,
) -> Option<T> {
    // Validated once here, the text is read as a `str`: serde_json then does not validate each
    // string it reads again (a tenth of a 1-turn body's parse time).
    let text = std::str::from_utf8(bytes).ok()?;
    if !fast_path_safe(text.as_bytes()) {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = read(&mut de).ok()?;
    de.end().ok()?;
    Some(value)
}

/// An object key as the text holds it: borrowed unless it had escapes. Lets a map visitor look at
/// a key before handing it on to the derived visitor it wraps.
pub(crate) enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

impl<'de> Key<'de> {
    /// Hand the key on to `seed` (a derived visitor's field identifier).
    pub(crate) fn feed<S: DeserializeSeed<'de>, E: de::Error>(
        self,
        seed: S,
    ) -> Result<S::Value, E> {
        match self {
            Key::Borrowed(s) => seed.deserialize(BorrowedStrDeserializer::new(s)),
            Key::Owned(s) => seed.deserialize(StringDeserializer::new(s)),
        }
    }
}

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(s))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> Result<Key<'de>, E> {
                Ok(Key::Owned(s))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// The body as a JSON value (text is parsed; syntax errors read `invalid JSON request: ...`).
pub(crate) fn to_value(body: RequestBody<'_>) -> Result<Value, RecipeError> {
    match body {
        RequestBody::Text(bytes) => serde_json::from_slice::<Value>(bytes)
            .map_err(|e| RecipeError::InvalidBody(format!("invalid JSON request: {e}"))),
        RequestBody::Value(v) => Ok(v),
    }
}

/// Whether the typed fast path accepts exactly what the path through a value accepts, for text
/// that is valid UTF-8 (skipped strings are not validated: [`read_fast`] checks the whole text
/// first). The typed path skips unknown fields without looking at them the way building a value
/// does, so text with anything a value would refuse there takes the slow path:
/// - nesting near serde_json's recursion limit (128; skipped values are not depth-checked);
/// - unpaired UTF-16 surrogate escapes (skipped escapes are not checked for pairing);
/// - numbers that may overflow an f64 (skipped numbers are not computed).
///
/// Each check may refuse text a value would accept (the slow path then reads it); none may let
/// through text it would refuse. Malformed text is left to the parser.
fn fast_path_safe(bytes: &[u8]) -> bool {
    const DEPTH_LIMIT: usize = 100;
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => match skip_string(bytes, i + 1) {
                Some(end) => i = end,
                None => return false,
            },
            b'[' | b'{' => {
                depth += 1;
                if depth > DEPTH_LIMIT {
                    return false;
                }
                i += 1;
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'-' | b'0'..=b'9' => match skip_number(bytes, i) {
                Some(end) => i = end,
                None => return false,
            },
            _ => i += 1,
        }
    }
    true
}

/// The index after the string whose contents start at `i`, or `None` if it holds an escape a
/// value would refuse (or anything unusual). An unterminated string ends the text.
fn skip_string(bytes: &[u8], mut i: usize) -> Option<usize> {
    // Keys and short values end within a few bytes: a plain loop finds their end sooner than
    // memchr2's setup does (callgrind: memchr2 was about half of this scan on a 1-turn body).
    const SHORT: usize = 24;
    let head = bytes.get(i..).unwrap_or_default();
    for (k, &b) in head.iter().take(SHORT).enumerate() {
        match b {
            b'"' => return Some(i + k + 1),
            b'\\' => break,
            _ => {}
        }
    }
    loop {
        let rest = bytes.get(i..).unwrap_or_default();
        match memchr::memchr2(b'"', b'\\', rest) {
            None => return Some(bytes.len()),
            Some(k) if rest[k] == b'"' => return Some(i + k + 1),
            Some(k) => {
                let escape = i + k;
                if bytes.get(escape + 1) != Some(&b'u') {
                    i = escape + 2;
                    continue;
                }
                let unit = hex4(bytes, escape + 2)?;
                i = escape + 6;
                match unit {
                    0xDC00..=0xDFFF => return None,
                    0xD800..=0xDBFF => {
                        // A leading surrogate must be followed by a trailing one.
                        if bytes.get(i) != Some(&b'\\') || bytes.get(i + 1) != Some(&b'u') {
                            return None;
                        }
                        if !(0xDC00..=0xDFFF).contains(&hex4(bytes, i + 2)?) {
                            return None;
                        }
                        i += 6;
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Four hex digits at `i` as a UTF-16 code unit.
fn hex4(bytes: &[u8], i: usize) -> Option<u16> {
    let digits = std::str::from_utf8(bytes.get(i..i + 4)?).ok()?;
    u16::from_str_radix(digits, 16).ok()
}

/// The index after the number token at `i`, or `None` if its value might overflow an f64 (an
/// integer part of more than 300 digits, or a non-negative exponent that may reach 1e300).
fn skip_number(bytes: &[u8], mut i: usize) -> Option<usize> {
    const MAX_DIGITS: usize = 300;
    if bytes[i] == b'-' {
        i += 1;
    }
    let digits = |i: usize| bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
    let integer = digits(i);
    i += integer;
    if bytes.get(i) == Some(&b'.') {
        i += 1;
        i += digits(i);
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        i += 1;
        let negative = bytes.get(i) == Some(&b'-');
        if matches!(bytes.get(i), Some(b'-' | b'+')) {
            i += 1;
        }
        let exponent_digits = digits(i);
        if !negative {
            let exponent = std::str::from_utf8(&bytes[i..i + exponent_digits])
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .unwrap_or(usize::MAX);
            if exponent_digits > 3 || integer.saturating_add(exponent) > MAX_DIGITS {
                return None;
            }
        }
        i += exponent_digits;
    }
    (integer <= MAX_DIGITS).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::{fast_path_safe, read_fast};
    use serde::de::{Deserializer, IgnoredAny};

    #[test]
    fn invalid_utf8_is_not_read_fast() {
        // Skipped, the string is not validated by the parser: only the check up front sees it.
        let skip = |bytes: &[u8]| read_fast(bytes, |de| de.deserialize_ignored_any(IgnoredAny));
        assert!(skip(b"{\"a\": \"\xff\"}").is_none());
        assert!(skip("{\"a\": \"\u{e9}\"}".as_bytes()).is_some());
    }

    #[test]
    fn depth_counts_brackets_outside_strings_only() {
        assert!(fast_path_safe(br#"{"a": [1, {"b": "[[[[\"{{"}]}"#));
        let deep = "[".repeat(101) + &"]".repeat(101);
        assert!(!fast_path_safe(deep.as_bytes()));
        let quoted = format!("{{\"a\": \"{}\"}}", "[".repeat(500));
        assert!(fast_path_safe(quoted.as_bytes()));
        assert!(fast_path_safe(br#"{"a": "unterminated \"#));
    }

    #[test]
    fn text_a_value_would_refuse_is_not_safe() {
        assert!(!fast_path_safe(br#"{"a": "\udc00"}"#));
        assert!(!fast_path_safe(br#"{"a": "\ud800"}"#));
        assert!(!fast_path_safe(br#"{"a": "\ud800\u0041"}"#));
        assert!(!fast_path_safe(br#"{"a": 1e400}"#));
        assert!(!fast_path_safe(br#"{"a": -1E+308}"#));
        assert!(!fast_path_safe(
            format!("{{\"a\": {}}}", "9".repeat(400)).as_bytes()
        ));
        assert!(!fast_path_safe(br#"{"a": 1e99999999999999999999}"#));
    }

    #[test]
    fn ordinary_text_is_safe() {
        assert!(fast_path_safe(
            br#"{"a": "\ud83d\ude00 \u00e9 \n \\", "b": [1.5, -2, 3e-400, 1e5, 0.25E+2]}"#
        ));
        assert!(fast_path_safe("{\"a\": \"é ｜\"}".as_bytes()));
        assert!(fast_path_safe(br#"{"a": true, "b": false, "c": null}"#));
    }
}
