//! JSON as Python's `json.dumps(value, ensure_ascii=False)` writes it: `", "` and `": "`
//! separators, keys in their original order, non-ASCII characters raw, and floats in the style of
//! the model version being rendered (see [`NumberStyle`]).

use serde_json::{Number, Value};

/// How floats are spelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumberStyle {
    /// Python `repr(float)`: positional for exponents -4..16, else `1.5e-05` / `1e+16`.
    PythonRepr,
    /// The V4 renderer's spelling: positional down to exponent -5, and negative exponents without
    /// zero padding below that (`0.000015`, `1e-6`); large values as Python (`1e+16`).
    V4,
}

pub fn to_string(value: &Value, style: NumberStyle) -> String {
    let mut out = String::new();
    write_value(&mut out, value, style);
    out
}

pub fn write_value(out: &mut String, value: &Value, style: NumberStyle) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n, style),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item, style);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(out, k);
                out.push_str(": ");
                write_value(out, v, style);
            }
            out.push('}');
        }
    }
}

/// A JSON string literal with Python's escapes (`ensure_ascii=False`): quote, backslash and
/// control characters only.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape: Option<&str> = match b {
            b'"' => Some("\\\""),
            b'\\' => Some("\\\\"),
            b'\n' => Some("\\n"),
            b'\r' => Some("\\r"),
            b'\t' => Some("\\t"),
            0x08 => Some("\\b"),
            0x0c => Some("\\f"),
            0x00..=0x1f => None,
            _ => continue,
        };
        out.push_str(&s[start..i]);
        match escape {
            Some(e) => out.push_str(e),
            None => {
                out.push_str("\\u00");
                out.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
                out.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
            }
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

fn write_number(out: &mut String, n: &Number, style: NumberStyle) {
    if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else if let Some(f) = n.as_f64() {
        out.push_str(&format_float(f, style));
    }
}

/// Shortest round-trip spelling of `f` in the given style.
pub fn format_float(f: f64, style: NumberStyle) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // `{:e}` gives the shortest digits that round-trip, e.g. "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let low = match style {
        NumberStyle::PythonRepr => -4,
        NumberStyle::V4 => -5,
    };
    let mut out = String::with_capacity(24);
    if negative {
        out.push('-');
    }
    if (low..16).contains(&exp) {
        positional(&mut out, &digits, exp);
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        if exp < 0 {
            out.push('-');
            match style {
                NumberStyle::PythonRepr => out.push_str(&format!("{:02}", -exp)),
                NumberStyle::V4 => out.push_str(&(-exp).to_string()),
            }
        } else {
            out.push('+');
            out.push_str(&format!("{exp:02}"));
        }
    }
    out
}

/// `digits` (d1 d2 ...) times 10^(exp - len + 1), written positionally with at least one digit
/// after the point.
fn positional(out: &mut String, digits: &str, exp: i32) {
    let len = digits.len() as i32;
    if exp < 0 {
        out.push_str("0.");
        for _ in 0..(-exp - 1) {
            out.push('0');
        }
        out.push_str(digits);
    } else if exp + 1 >= len {
        out.push_str(digits);
        for _ in 0..(exp + 1 - len) {
            out.push('0');
        }
        out.push_str(".0");
    } else {
        let point = (exp + 1) as usize;
        out.push_str(&digits[..point]);
        out.push('.');
        out.push_str(&digits[point..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(f: f64) -> String {
        format_float(f, NumberStyle::PythonRepr)
    }
    fn v4(f: f64) -> String {
        format_float(f, NumberStyle::V4)
    }

    #[test]
    fn python_repr_spellings() {
        for (f, s) in [
            (1.0, "1.0"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (1e-7, "1e-07"),
            (-0.0, "-0.0"),
            (1.2345678901234568e16, "1.2345678901234568e+16"),
            (0.1, "0.1"),
            (1e15, "1000000000000000.0"),
            (123456.789e3, "123456789.0"),
            (0.0001, "0.0001"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (1e23, "1e+23"),
            (2.5, "2.5"),
        ] {
            assert_eq!(py(f), s, "{f:e}");
        }
    }

    #[test]
    fn v4_spellings() {
        for (f, s) in [
            (1.5e-5, "0.000015"),
            (1e-5, "0.00001"),
            (1e-6, "1e-6"),
            (1.234e-6, "1.234e-6"),
            (1e-7, "1e-7"),
            (5e-5, "0.00005"),
            (1e16, "1e+16"),
            (1e21, "1e+21"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
        ] {
            assert_eq!(v4(f), s, "{f:e}");
        }
    }

    #[test]
    fn strings_escape_like_python() {
        let mut out = String::new();
        write_string(&mut out, "日本\u{1}\t\u{2028}\u{7f}\"\\");
        assert_eq!(out, "\"日本\\u0001\\t\u{2028}\u{7f}\\\"\\\\\"");
    }

    #[test]
    fn containers_use_python_separators() {
        let v: Value = serde_json::from_str(r#"{"a": [1, "x", {"k": null}], "b": true}"#).unwrap();
        assert_eq!(
            to_string(&v, NumberStyle::PythonRepr),
            r#"{"a": [1, "x", {"k": null}], "b": true}"#
        );
    }
}
