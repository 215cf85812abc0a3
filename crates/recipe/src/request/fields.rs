//! Reading named top-level fields of a request body without building the rest.
//!
//! A server honours request fields that the protocol wire types do not read (vLLM-style sampling
//! extensions such as `top_k` or `stop_token_ids`) or read and drop (`presence_penalty`). The
//! typed requests keep their official shape; this reads just the fields a caller names, skipping
//! every other value without building it, so even an 8 MB body costs one allocation-free scan.

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

#[cfg(test)]
mod tests {
    use super::pick_fields;
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
}
