//! The `$defs` deviation: definitions a kept `$ref` points to are kept, normalised.

use serde_json::{Map, Value};

use super::model::{Node, ObjectNode};
use super::strict::validate;

/// Copy into `out` the `$defs` / `definitions` entries of the top-level `input` that the
/// normalised schema refers to (transitively), each normalised when it can be.
pub(super) fn keep_referenced_definitions(input: &Value, _top: &ObjectNode, out: &mut Value) {
    let Some(input) = input.as_object() else {
        return;
    };
    let mut refs = Vec::new();
    collect_refs(out, &mut refs);
    let mut kept: Vec<(String, Map<String, Value>)> = Vec::new();
    let mut i = 0;
    while i < refs.len() {
        let reference = refs[i].clone();
        i += 1;
        for section in ["$defs", "definitions"] {
            let Some(rest) = reference.strip_prefix(&format!("#/{section}/")) else {
                continue;
            };
            // The first pointer segment names the definition (a deeper pointer keeps all of it).
            let segment = rest.split('/').next().unwrap_or(rest);
            let name = pointer_segment(segment);
            let name = name.as_str();
            let Some(def) = input.get(section).and_then(|d| d.get(name)) else {
                continue;
            };
            let slot = match kept.iter_mut().find(|(s, _)| s == section) {
                Some((_, m)) => m,
                None => {
                    kept.push((section.to_string(), Map::new()));
                    &mut kept.last_mut().expect("just pushed").1
                }
            };
            if slot.contains_key(name) {
                continue;
            }
            let normalized = serde_json::from_value::<Node>(def.clone())
                .ok()
                .filter(|n| validate(n, true).is_ok())
                .map(|n| n.to_value())
                .unwrap_or_else(|| def.clone());
            collect_refs(&normalized, &mut refs);
            slot.insert(name.to_string(), normalized);
        }
    }
    if let Some(obj) = out.as_object_mut() {
        for (section, defs) in kept {
            obj.insert(section, Value::Object(defs));
        }
    }
}

/// A JSON Pointer segment of a URI fragment: percent-decoded, then `~1` -> `/` and `~0` -> `~`.
fn pointer_segment(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                decoded.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        decoded.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&decoded)
        .replace("~1", "/")
        .replace("~0", "~")
}

fn collect_refs(v: &Value, refs: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                if !refs.contains(r) {
                    refs.push(r.clone());
                }
            }
            m.values().for_each(|c| collect_refs(c, refs));
        }
        Value::Array(a) => a.iter().for_each(|c| collect_refs(c, refs)),
        _ => {}
    }
}
