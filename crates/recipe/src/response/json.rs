//! Compact JSON writing for protocol events.
//!
//! Servers send `to_json()` as is, so the bytes must equal deepseek-recipe's: compact, keys in the
//! official order, strings escaped as serde_json escapes them (non-ASCII kept raw), floats in
//! serde_json's shortest round-trip form (`1.0`, `-0.5`, `1e-7`). Writing by hand keeps the key
//! order explicit and avoids building a `Value` per event.

use crate::stream::{LogprobEntry, TokenLogprobs};

/// A JSON string literal.
pub(crate) fn string(out: &mut String, s: &str) {
    // serde_json's escaping is the reference; it cannot fail on a String target.
    let mut buf = Vec::with_capacity(s.len() + 2);
    if serde_json::to_writer(&mut buf, s).is_ok() {
        out.push_str(&String::from_utf8_lossy(&buf));
    }
}

/// Escape `s` as the inside of a JSON string (no quotes): tool-argument string values.
pub(crate) fn escaped(out: &mut String, s: &str) {
    let start = out.len();
    string(out, s);
    // Drop the quotes `string` wrote around the value.
    if out.len() >= start + 2 {
        out.pop();
        out.remove(start);
    }
}

pub(crate) fn opt_string(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => string(out, s),
        None => out.push_str("null"),
    }
}

pub(crate) fn float(out: &mut String, v: f64) {
    match serde_json::to_string(&v) {
        Ok(s) => out.push_str(&s),
        Err(_) => out.push_str("null"),
    }
}

pub(crate) fn uint(out: &mut String, v: u64) {
    use std::fmt::Write;
    let _ = write!(out, "{v}");
}

pub(crate) fn opt_uint(out: &mut String, v: Option<u64>) {
    match v {
        Some(v) => uint(out, v),
        None => out.push_str("null"),
    }
}

/// A JSON value, compact, keys in insertion order.
pub(crate) fn value(out: &mut String, v: &serde_json::Value) {
    match serde_json::to_string(v) {
        Ok(s) => out.push_str(&s),
        Err(_) => out.push_str("null"),
    }
}

fn entry_fields(out: &mut String, e: &LogprobEntry) {
    out.push_str("{\"token\":");
    string(out, &e.token);
    out.push_str(",\"logprob\":");
    float(out, e.logprob);
    out.push_str(",\"bytes\":[");
    for (i, b) in e.bytes.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        uint(out, u64::from(*b));
    }
    out.push(']');
}

/// `[{"token","logprob","bytes","top_logprobs":[{"token","logprob","bytes"}…]}…]`
pub(crate) fn logprobs(out: &mut String, lps: &[TokenLogprobs]) {
    out.push('[');
    for (i, lp) in lps.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        entry_fields(out, &lp.entry);
        out.push_str(",\"top_logprobs\":[");
        for (k, t) in lp.top_logprobs.iter().enumerate() {
            if k > 0 {
                out.push(',');
            }
            entry_fields(out, t);
            out.push('}');
        }
        out.push_str("]}");
    }
    out.push(']');
}
