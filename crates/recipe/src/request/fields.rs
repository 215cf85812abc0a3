//! Reading named top-level fields of a request body without building the rest.
//!
//! A server honours request fields that the protocol wire types do not read (vLLM-style sampling
//! extensions such as `top_k` or `stop_token_ids`) or read and drop (`presence_penalty`). The
//! typed requests keep their official shape; this reads just the fields a caller names, skipping
//! every other value without building it, so even an 8 MB body costs one allocation-free scan.
//!
//! [`outline`] is the same scan for a server that refuses what it does not serve: besides the
//! named fields it lists the body's top-level keys (to refuse unknown ones) and the `type` tags
//! found at any depth (a cheap first look for content it cannot serve, such as images).

use std::collections::BTreeSet;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::body::Key;
use crate::error::RecipeError;

/// The values of the top-level fields `names` of the JSON object in `bytes`, in the order they
/// are first seen, as serde reads them: escaped keys match by their unescaped name and a
/// repeated key's last value wins (as when the body is read through a value). A body that is
/// an array (serde's positional form of a struct) has no named fields.
pub fn pick_fields(bytes: &[u8], names: &[&str]) -> Result<Vec<(String, Value)>, RecipeError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let picked = Pick { names }
        .deserialize(&mut de)
        .and_then(|picked| de.end().map(|()| picked))
        .map_err(|e| RecipeError::InvalidBody(format!("invalid JSON request: {e}")))?;
    Ok(picked)
}

struct Pick<'n> {
    names: &'n [&'n str],
}

impl<'de> DeserializeSeed<'de> for Pick<'_> {
    type Value = Vec<(String, Value)>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Pick<'_> {
    type Value = Vec<(String, Value)>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a request object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out: Vec<(String, Value)> = Vec::new();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            let name = key.as_str();
            if !self.names.contains(&name) {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let value: Value = map.next_value()?;
            match out.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = value,
                None => out.push((name.to_owned(), value)),
            }
        }
        Ok(out)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Vec::new())
    }
}

/// What [`outline`] reads of a request body.
#[derive(Debug, Default, PartialEq)]
pub struct Outline {
    /// The top-level keys, each once, in the order they are first seen.
    pub keys: Vec<String>,
    /// Every string value of a `type` key, at any depth (content block, item and tool kinds,
    /// JSON Schema types...). A value that is not a string is looked into instead.
    pub tags: BTreeSet<String>,
    /// The named top-level fields that are present, as [`pick_fields`] reads them.
    pub fields: Vec<(String, Value)>,
}

/// The [`Outline`] of the JSON object in `bytes`, in one scan that builds only the named fields
/// (other values are walked for their `type` tags without being built). Keys match by their
/// unescaped name; a repeated field's last value wins. An array body has no keys or fields.
pub fn outline(bytes: &[u8], names: &[&str]) -> Result<Outline, RecipeError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let mut out = Outline::default();
    Top {
        names,
        out: &mut out,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end())
    .map_err(|e| RecipeError::InvalidBody(format!("invalid JSON request: {e}")))?;
    Ok(out)
}

/// [`outline`] of a body that is already a JSON value.
pub fn outline_value(body: &Value, names: &[&str]) -> Outline {
    let mut out = Outline::default();
    match body {
        Value::Object(map) => {
            for (key, value) in map {
                out.keys.push(key.clone());
                if names.contains(&key.as_str()) {
                    out.fields.push((key.clone(), value.clone()));
                }
                value_tags(value, key == "type", &mut out.tags);
            }
        }
        other => value_tags(other, false, &mut out.tags),
    }
    out
}

/// Collect the `type` tags of a built value (`is_tag`: the value of a `type` key).
fn value_tags(value: &Value, is_tag: bool, tags: &mut BTreeSet<String>) {
    match value {
        Value::String(s) if is_tag && !tags.contains(s) => {
            tags.insert(s.clone());
        }
        Value::Object(map) => {
            for (key, v) in map {
                value_tags(v, key == "type", tags);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| value_tags(v, false, tags)),
        _ => {}
    }
}

/// The top-level object: keys, named fields, and the tags of everything.
struct Top<'a> {
    names: &'a [&'a str],
    out: &'a mut Outline,
}

impl<'de> DeserializeSeed<'de> for Top<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Top<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a request object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let out = self.out;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            let name = key.as_str();
            if !out.keys.iter().any(|k| k == name) {
                out.keys.push(name.to_owned());
            }
            if self.names.contains(&name) {
                let value: Value = map.next_value()?;
                value_tags(&value, name == "type", &mut out.tags);
                match out.fields.iter_mut().find(|(n, _)| n == name) {
                    Some(slot) => slot.1 = value,
                    None => out.fields.push((name.to_owned(), value)),
                }
            } else {
                map.next_value_seed(Walk {
                    tags: &mut out.tags,
                    is_tag: name == "type",
                })?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let tags = &mut self.out.tags;
        while seq
            .next_element_seed(Walk {
                tags,
                is_tag: false,
            })?
            .is_some()
        {}
        Ok(())
    }
}

/// Any value, walked for the `type` tags inside it without being built.
struct Walk<'a> {
    tags: &'a mut BTreeSet<String>,
    /// The value of a `type` key: a string here is a tag.
    is_tag: bool,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Key<'de>>()? {
            map.next_value_seed(Walk {
                tags: self.tags,
                is_tag: key.as_str() == "type",
            })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq
            .next_element_seed(Walk {
                tags: self.tags,
                is_tag: false,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_str<E>(self, s: &str) -> Result<(), E> {
        if self.is_tag && !self.tags.contains(s) {
            self.tags.insert(s.to_owned());
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{outline, outline_value, pick_fields};
    use serde_json::json;

    #[test]
    fn picks_only_the_named_top_level_fields() {
        let body = br#"{"model": "m", "top_k": 5, "messages": [{"top_k": 9}], "min_p": 0.1}"#;
        let got = pick_fields(body, &["top_k", "min_p", "absent"]).unwrap();
        assert_eq!(
            got,
            vec![
                ("top_k".to_owned(), json!(5)),
                ("min_p".to_owned(), json!(0.1))
            ]
        );
    }

    #[test]
    fn escaped_keys_match_and_the_last_repeat_wins() {
        let body = br#"{"top\u005fk": 1, "x": {"top_k": 2}, "top_k": [3]}"#;
        let got = pick_fields(body, &["top_k"]).unwrap();
        assert_eq!(got, vec![("top_k".to_owned(), json!([3]))]);
    }

    #[test]
    fn arrays_have_no_fields_and_bad_json_is_an_error() {
        assert!(pick_fields(br#"[1, {"top_k": 2}]"#, &["top_k"])
            .unwrap()
            .is_empty());
        assert!(pick_fields(br#"{"top_k": 1"#, &["top_k"]).is_err());
        assert!(pick_fields(br#"{"top_k": 1} x"#, &["top_k"]).is_err());
        assert!(pick_fields(b"7", &["top_k"]).is_err());
    }

    #[test]
    fn outline_lists_keys_tags_and_named_fields() {
        let body = br#"{"model": "m", "input": [{"type": "message", "content": [{"type": "input_image"}]}],
            "tools": [{"type": "function", "parameters": {"type": "object", "properties":
            {"type": {"type": "string"}}}}], "top_k": 3, "model": "n", "x": {"type": 5}}"#;
        let got = outline(body, &["tools", "top_k", "absent"]).unwrap();
        assert_eq!(got.keys, ["model", "input", "tools", "top_k", "x"]);
        let tags: Vec<&str> = got.tags.iter().map(String::as_str).collect();
        assert_eq!(
            tags,
            ["function", "input_image", "message", "object", "string"]
        );
        assert_eq!(got.fields.len(), 2);
        assert_eq!(got.fields[0].0, "tools");
        assert_eq!(got.fields[1], ("top_k".to_owned(), json!(3)));
        let value: serde_json::Value = serde_json::from_slice(body).unwrap();
        let from_value = outline_value(&value, &["tools", "top_k", "absent"]);
        assert_eq!(from_value.tags, got.tags);
        assert_eq!(from_value.fields, got.fields);
        // The value keeps one "model", in its first place (serde_json's preserve_order).
        assert_eq!(from_value.keys, got.keys);
    }

    #[test]
    fn outline_unescapes_keys_and_tags_and_refuses_bad_json() {
        let got = outline(
            br#"{"ty\u0070e": "im\u0061ge", "a": [{"type": "b"}], "a": 1}"#,
            &["a"],
        )
        .unwrap();
        assert_eq!(got.keys, ["type", "a"]);
        assert!(got.tags.contains("image") && got.tags.contains("b"));
        assert_eq!(got.fields, vec![("a".to_owned(), json!(1))]);
        let array = outline(br#"[{"type": "t"}]"#, &["a"]).unwrap();
        assert!(array.keys.is_empty() && array.tags.contains("t"));
        for bad in [&br#"{"a": "#[..], br#"{"a": 1} x"#, br#"{"a": [}"#] {
            assert!(outline(bad, &[]).is_err());
        }
        let deep = format!("{{\"a\": {}{}}}", "[".repeat(200), "]".repeat(200));
        assert!(outline(deep.as_bytes(), &[]).is_err()); // serde_json's recursion limit
    }
}
