//! Request bodies: JSON text (str / bytes) or an already-built JSON value (from a Python dict).

use serde::de::DeserializeOwned;
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
    if let RequestBody::Text(bytes) = &body {
        // Fast path: text straight into the typed request, without building a JSON value first
        // (about half the parse time). Any failure is reported by the path through a value,
        // whose messages are the official's (shape errors without a position; a duplicated key
        // is not an error there, the last one wins).
        // Skipped unknown fields are not depth-checked there, so deep bodies take the slow path.
        if shallow(bytes) {
            if let Ok(request) = serde_json::from_slice::<T>(bytes) {
                return Ok(request);
            }
        }
    }
    serde_json::from_value(to_value(body)?)
        .map_err(|e| RecipeError::InvalidBody(format!("invalid request body: {e}")))
}

/// The body as a JSON value (text is parsed; syntax errors read `invalid JSON request: ...`).
pub(crate) fn to_value(body: RequestBody<'_>) -> Result<Value, RecipeError> {
    match body {
        RequestBody::Text(bytes) => serde_json::from_slice::<Value>(bytes)
            .map_err(|e| RecipeError::InvalidBody(format!("invalid JSON request: {e}"))),
        RequestBody::Value(v) => Ok(v),
    }
}

/// Whether `bytes` nests arrays and objects well below serde_json's recursion limit (128), which
/// the path through a value enforces everywhere. Strings are skipped with memchr; malformed text
/// is left to the parser.
fn shallow(bytes: &[u8]) -> bool {
    const LIMIT: usize = 100;
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                loop {
                    match memchr::memchr2(b'"', b'\\', &bytes[i.min(bytes.len())..]) {
                        Some(k) if bytes[i + k] == b'\\' => i += k + 2,
                        Some(k) => {
                            i += k + 1;
                            break;
                        }
                        None => return true,
                    }
                }
                continue;
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > LIMIT {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::shallow;

    #[test]
    fn depth_counts_brackets_outside_strings_only() {
        assert!(shallow(br#"{"a": [1, {"b": "[[[[\"{{"}]}"#));
        let deep = "[".repeat(101) + &"]".repeat(101);
        assert!(!shallow(deep.as_bytes()));
        let quoted = format!("{{\"a\": \"{}\"}}", "[".repeat(500));
        assert!(shallow(quoted.as_bytes()));
        assert!(shallow(br#"{"a": "unterminated \"#));
    }
}
