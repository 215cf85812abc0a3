//! Strict-mode rules, and the normalised schema written back from the typed model.

use serde_json::{Map, Value};

use super::model::Node;
use super::SchemaError;

fn rule(message: impl Into<String>) -> SchemaError {
    SchemaError::Rule(message.into())
}

pub(super) fn validate(node: &Node, properties_required: bool) -> Result<(), SchemaError> {
    match node {
        Node::Object(o) => {
            if o.additional_properties == Some(true) {
                return Err(rule("additionalProperties should not be true"));
            }
            let props = o.properties.as_ref().map(|p| &p.0);
            if properties_required && props.is_none_or(|p| p.is_empty()) {
                return Err(rule("An object with no properties is not allowed."));
            }
            // Children are checked before this object's `required` list.
            props
                .into_iter()
                .flatten()
                .try_for_each(|(_, child)| validate(child, true))?;
            if let Some(required) = &o.required {
                let mut seen = std::collections::HashSet::new();
                for name in required {
                    if !seen.insert(name.as_str()) {
                        return Err(rule(format!("Duplicate required property '{name}'")));
                    }
                    if !props.is_some_and(|p| p.iter().any(|(k, _)| k == name)) {
                        return Err(rule(format!(
                            "Required property '{name}' not found in object"
                        )));
                    }
                }
                if seen.len() != props.map_or(0, Vec::len) {
                    return Err(rule(
                        "Required properties must match all properties in the object",
                    ));
                }
            }
            Ok(())
        }
        Node::Array(a) => validate(&a.items, true),
        Node::AnyOf(a) => a.any_of.iter().try_for_each(|n| validate(n, true)),
        _ => Ok(()),
    }
}

impl Node {
    pub(super) fn to_value(&self) -> Value {
        let mut m = Map::new();
        let desc = |m: &mut Map<String, Value>, d: &Option<String>| {
            if let Some(d) = d {
                m.insert("description".into(), Value::String(d.clone()));
            }
        };
        match self {
            Node::Object(o) => {
                m.insert("type".into(), "object".into());
                let mut props = Map::new();
                let mut names = Vec::new();
                for (k, child) in o.properties.iter().flat_map(|p| p.0.iter()) {
                    props.insert(k.clone(), child.to_value());
                    names.push(Value::String(k.clone()));
                }
                m.insert("properties".into(), Value::Object(props));
                m.insert("additionalProperties".into(), Value::Bool(false));
                m.insert("required".into(), Value::Array(names));
                desc(&mut m, &o.description);
            }
            Node::String(s) => {
                m.insert("type".into(), "string".into());
                desc(&mut m, &s.description);
                if let Some(p) = &s.pattern {
                    m.insert("pattern".into(), Value::String(p.clone()));
                }
                if let Some(f) = &s.format {
                    m.insert("format".into(), f.as_str().into());
                }
                if let Some(e) = &s.enumeration {
                    m.insert(
                        "enum".into(),
                        e.iter().cloned().map(Value::String).collect(),
                    );
                }
            }
            Node::Integer(n) => {
                m.insert("type".into(), "integer".into());
                desc(&mut m, &n.description);
                for (key, v) in [
                    ("const", n.constant),
                    ("default", n.default),
                    ("minimum", n.minimum),
                    ("maximum", n.maximum),
                    ("exclusiveMinimum", n.exclusive_minimum),
                    ("exclusiveMaximum", n.exclusive_maximum),
                    ("multipleOf", n.multiple_of),
                ] {
                    if let Some(v) = v {
                        m.insert(key.into(), Value::from(v));
                    }
                }
            }
            Node::Number(n) => {
                m.insert("type".into(), "number".into());
                desc(&mut m, &n.description);
                for (key, v) in [
                    ("const", &n.constant),
                    ("default", &n.default),
                    ("minimum", &n.minimum),
                    ("maximum", &n.maximum),
                    ("exclusiveMinimum", &n.exclusive_minimum),
                    ("exclusiveMaximum", &n.exclusive_maximum),
                    ("multipleOf", &n.multiple_of),
                ] {
                    if let Some(v) = v {
                        m.insert(key.into(), Value::Number(v.clone()));
                    }
                }
            }
            Node::Boolean(d) | Node::Null(d) => {
                let kind = if matches!(self, Node::Boolean(_)) {
                    "boolean"
                } else {
                    "null"
                };
                m.insert("type".into(), kind.into());
                desc(&mut m, &d.description);
            }
            Node::Array(a) => {
                m.insert("type".into(), "array".into());
                m.insert("items".into(), a.items.to_value());
                desc(&mut m, &a.description);
            }
            Node::Multi(types, d) => {
                m.insert(
                    "type".into(),
                    types.iter().map(|t| Value::from(t.as_str())).collect(),
                );
                desc(&mut m, &d.description);
            }
            Node::AnyOf(a) => {
                m.insert(
                    "anyOf".into(),
                    a.any_of.iter().map(Node::to_value).collect(),
                );
                desc(&mut m, &a.description);
            }
            Node::Ref(r) => {
                m.insert("$ref".into(), Value::String(r.reference.clone()));
            }
        }
        Value::Object(m)
    }
}
