//! Tool-parameter and response-format schemas: meta-validation, and the strict normalisation of
//! `strict: true` schemas.
//!
//! Strict normalisation reads the schema into a small typed model (one node kind per `type`, plus
//! `anyOf` and `$ref` nodes) and writes it back: objects get `additionalProperties: false` and
//! every property required, and only the keywords the model has survive. Reading follows the key
//! order of the input, so when a schema has several problems the first one in document order is
//! reported, with deepseek-recipe's wording.
//!
//! Deviation (recipe/DEVIATIONS.md): `$defs` / `definitions` entries that a kept `$ref` points to
//! are kept (normalised); the official drops them and leaves the reference dangling.

use serde::de::{Error as _, Unexpected};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Number, Value};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Why a schema was rejected: a read error (wrong shape, reported with a context prefix) or a
/// rule of strict mode (reported as is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaError {
    Shape(String),
    Rule(String),
}

/// JSON Schema meta-validation and compilation (local `$ref`s must resolve); the message of the
/// first problem.
///
/// Compiling a schema costs tens of microseconds, and a server sees the same tool schemas on
/// almost every request, so outcomes are memoised by the schema's JSON text (bounded; the
/// outcome depends on nothing else).
pub fn meta_validate(schema: &Value) -> Result<(), String> {
    const CAPACITY: usize = 4096;
    static SEEN: OnceLock<Mutex<HashMap<String, Result<(), String>>>> = OnceLock::new();
    let key = schema.to_string();
    let seen = SEEN.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(outcome) = seen.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return outcome;
    }
    let outcome = compile(schema);
    if let Ok(mut m) = seen.lock() {
        if m.len() >= CAPACITY {
            m.clear();
        }
        m.insert(key, outcome.clone());
    }
    outcome
}

fn compile(schema: &Value) -> Result<(), String> {
    jsonschema::meta::validate(schema).map_err(|e| e.to_string())?;
    jsonschema::options()
        .with_retriever(NoRetrieval)
        .build(schema)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Schemas are never fetched from elsewhere: a `$ref` outside the document is an error.
struct NoRetrieval;

impl jsonschema::Retrieve for NoRetrieval {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> std::result::Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!("Retrieval is disabled, cannot fetch {}", uri.as_str()).into())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Top {
    /// Function parameters: the top level must be an object; an object without properties is
    /// fine there.
    ToolParameters,
    /// A response-format schema: the top level must be an object with properties.
    ResponseFormat,
}

/// Strict normalisation of `schema`.
pub fn normalize_strict(schema: &Value, top: Top) -> Result<Value, SchemaError> {
    let node: Node =
        serde_json::from_value(schema.clone()).map_err(|e| SchemaError::Shape(e.to_string()))?;
    let Node::Object(obj) = &node else {
        return Err(SchemaError::Rule(
            match top {
                Top::ToolParameters => {
                    "The top level of the function parameters schema must be an object."
                }
                Top::ResponseFormat => "The top level of the json schema must be an object.",
            }
            .into(),
        ));
    };
    validate(&node, top == Top::ResponseFormat)?;
    let mut out = node.to_value();
    keep_referenced_definitions(schema, obj, &mut out);
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The typed model

#[derive(Debug, Clone)]
enum Node {
    Object(ObjectNode),
    String(StringNode),
    Number(NumberNode),
    Integer(IntegerNode),
    Boolean(Described),
    Null(Described),
    Array(ArrayNode),
    Multi(Vec<Primitive>, Described),
    AnyOf(AnyOfNode),
    Ref(RefNode),
}

#[derive(Debug, Clone, Deserialize)]
struct Described {
    description: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct ObjectNode {
    properties: Option<Props>,
    required: Option<Vec<String>>,
    #[serde(rename = "additionalProperties")]
    additional_properties: Option<bool>,
    description: Option<String>,
}

/// Properties in document order, each read as a node where it appears (so a bad property is
/// reported before a bad keyword that follows it).
#[derive(Debug, Clone, Default)]
struct Props(Vec<(String, Node)>);

impl<'de> Deserialize<'de> for Props {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Props;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Props, A::Error> {
                let mut out: Vec<(String, Node)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Node>()? {
                    match out.iter_mut().find(|(name, _)| *name == k) {
                        Some(slot) => slot.1 = v,
                        None => out.push((k, v)),
                    }
                }
                Ok(Props(out))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Format {
    Email,
    Hostname,
    Ipv4,
    Ipv6,
    Uuid,
}

impl Format {
    fn as_str(&self) -> &'static str {
        match self {
            Format::Email => "email",
            Format::Hostname => "hostname",
            Format::Ipv4 => "ipv4",
            Format::Ipv6 => "ipv6",
            Format::Uuid => "uuid",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
struct StringNode {
    description: Option<String>,
    pattern: Option<String>,
    format: Option<Format>,
    #[serde(rename = "enum")]
    enumeration: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
struct NumberNode {
    description: Option<String>,
    #[serde(rename = "const")]
    constant: Option<Number>,
    default: Option<Number>,
    minimum: Option<Number>,
    maximum: Option<Number>,
    #[serde(rename = "exclusiveMinimum")]
    exclusive_minimum: Option<Number>,
    #[serde(rename = "exclusiveMaximum")]
    exclusive_maximum: Option<Number>,
    #[serde(rename = "multipleOf")]
    multiple_of: Option<Number>,
}

/// Integer keywords are read as i64 (a fractional bound is an error, as in the official).
#[derive(Debug, Clone, Deserialize)]
struct IntegerNode {
    description: Option<String>,
    #[serde(rename = "const")]
    constant: Option<i64>,
    default: Option<i64>,
    minimum: Option<i64>,
    maximum: Option<i64>,
    #[serde(rename = "exclusiveMinimum")]
    exclusive_minimum: Option<i64>,
    #[serde(rename = "exclusiveMaximum")]
    exclusive_maximum: Option<i64>,
    #[serde(rename = "multipleOf")]
    multiple_of: Option<i64>,
}

#[derive(Debug, Clone, Deserialize)]
struct ArrayNode {
    items: Box<Node>,
    description: Option<String>,
}

/// `anyOf` alternatives must be typed schemas; errors inside read `field `anyOf`: ...`.
#[derive(Debug, Clone)]
struct AnyOfNode {
    any_of: Vec<Node>,
    description: Option<String>,
}

#[derive(Debug, Clone)]
struct RefNode {
    reference: String,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Primitive {
    String,
    Number,
    Integer,
    Boolean,
    Null,
}

impl Primitive {
    fn as_str(self) -> &'static str {
        match self {
            Primitive::String => "string",
            Primitive::Number => "number",
            Primitive::Integer => "integer",
            Primitive::Boolean => "boolean",
            Primitive::Null => "null",
        }
    }
}

const TYPES: &[&str] = &[
    "object", "string", "number", "integer", "boolean", "array", "null",
];

fn unexpected(v: &Value) -> Unexpected<'_> {
    match v {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Unexpected::Signed(i)
            } else if let Some(u) = n.as_u64() {
                Unexpected::Unsigned(u)
            } else {
                Unexpected::Float(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        node_from_value(value).map_err(D::Error::custom)
    }
}

fn fields<T: for<'de> Deserialize<'de>>(v: Value) -> Result<T, String> {
    serde_json::from_value(v).map_err(|e| e.to_string())
}

fn node_from_value(value: Value) -> Result<Node, String> {
    const KIND_REQUIRED: &str = "one of `type`, `anyOf`, `$ref` field is required";
    let Value::Object(map) = &value else {
        return Err(KIND_REQUIRED.into());
    };
    match map.get("type") {
        Some(Value::Array(_)) => return multi_type(value),
        Some(_) => return typed(value),
        None => {}
    }
    if map.contains_key("anyOf") {
        return any_of(value);
    }
    if map.contains_key("$ref") {
        let reference = match map.get("$ref") {
            Some(Value::String(r)) => r.clone(),
            Some(other) => {
                return Err(format!(
                    "field `$ref`: {}",
                    serde_json::Error::invalid_type(unexpected(other), &"a string")
                ))
            }
            None => unreachable!("checked above"),
        };
        return Ok(Node::Ref(RefNode { reference }));
    }
    Err(KIND_REQUIRED.into())
}

/// A schema with a single `type` (deepseek-recipe's internally tagged `JsonSchemaType`).
fn typed(value: Value) -> Result<Node, String> {
    let (tag, content) = match value {
        Value::Object(map) => match map.get("type") {
            None => return Err("missing field `type`".into()),
            Some(Value::String(name)) => (name.clone(), Value::Object(map)),
            Some(other) => return Err(not_a_variant(other)),
        },
        // serde reads an internally tagged enum from a sequence too: the tag first, then the
        // variant's fields by position.
        Value::Array(mut items) => {
            if items.is_empty() {
                return Err("missing field `type`".into());
            }
            let rest = items.split_off(1);
            match &items[0] {
                Value::String(name) => {
                    let name = name.clone();
                    check_positional(&name, rest.len())?;
                    (name, Value::Array(rest))
                }
                other => return Err(not_a_variant(other)),
            }
        }
        other => {
            return Err(serde_json::Error::invalid_type(
                unexpected(&other),
                &"internally tagged enum JsonSchemaType",
            )
            .to_string())
        }
    };
    match tag.as_str() {
        "object" => Ok(Node::Object(fields(content)?)),
        "string" => Ok(Node::String(fields(content)?)),
        "number" => Ok(Node::Number(fields(content)?)),
        "integer" => Ok(Node::Integer(fields(content)?)),
        "boolean" => Ok(Node::Boolean(fields(content)?)),
        "null" => Ok(Node::Null(fields(content)?)),
        "array" => Ok(Node::Array(fields(content)?)),
        other => Err(serde_json::Error::unknown_variant(other, TYPES).to_string()),
    }
}

fn not_a_variant(v: &Value) -> String {
    serde_json::Error::invalid_type(unexpected(v), &"variant identifier").to_string()
}

/// A positional (sequence) variant needs all of its fields, as deepseek-recipe's types count them.
fn check_positional(tag: &str, given: usize) -> Result<(), String> {
    let (variant, needed) = match tag {
        "object" => ("Object", 5),
        "string" => ("String", 4),
        "number" => ("Number", 8),
        "integer" => ("Integer", 8),
        "boolean" => ("Boolean", 1),
        "null" => ("Null", 1),
        "array" => ("Array", 2),
        other => return Err(serde_json::Error::unknown_variant(other, TYPES).to_string()),
    };
    if given >= needed {
        return Ok(());
    }
    let plural = if needed == 1 { "" } else { "s" };
    Err(format!(
        "invalid length {given}, expected struct variant JsonSchemaType::{variant} with {needed} element{plural}"
    ))
}

/// `{"type": [...], "description": ...}`: errors name the field.
fn multi_type(value: Value) -> Result<Node, String> {
    let mut types = Vec::new();
    let mut description = None;
    if let Value::Object(map) = value {
        for (key, v) in map {
            match key.as_str() {
                "type" => {
                    let items: Vec<Value> =
                        serde_json::from_value(v).map_err(|e| format!("field `type`: {e}"))?;
                    for item in items {
                        let p: Primitive = serde_json::from_value(item)
                            .map_err(|e| format!("field `type`: {e}"))?;
                        types.push(p);
                    }
                }
                "description" => {
                    description = serde_json::from_value::<Option<String>>(v)
                        .map_err(|e| format!("field `description`: {e}"))?;
                }
                _ => {}
            }
        }
    }
    Ok(Node::Multi(types, Described { description }))
}

fn any_of(value: Value) -> Result<Node, String> {
    let mut alternatives = Vec::new();
    let mut description = None;
    if let Value::Object(map) = value {
        for (key, v) in map {
            match key.as_str() {
                "anyOf" => {
                    let items: Vec<Value> =
                        serde_json::from_value(v).map_err(|e| format!("field `anyOf`: {e}"))?;
                    for item in items {
                        alternatives.push(typed(item).map_err(|e| format!("field `anyOf`: {e}"))?);
                    }
                }
                "description" => {
                    description = serde_json::from_value::<Option<String>>(v)
                        .map_err(|e| format!("field `description`: {e}"))?;
                }
                _ => {}
            }
        }
    }
    Ok(Node::AnyOf(AnyOfNode {
        any_of: alternatives,
        description,
    }))
}

// ---------------------------------------------------------------------------------------------
// Strict-mode rules

fn rule(message: impl Into<String>) -> SchemaError {
    SchemaError::Rule(message.into())
}

fn validate(node: &Node, properties_required: bool) -> Result<(), SchemaError> {
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
    fn to_value(&self) -> Value {
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

// ---------------------------------------------------------------------------------------------
// The `$defs` deviation

/// Copy into `out` the `$defs` / `definitions` entries of the top-level `input` that the
/// normalised schema refers to (transitively), each normalised when it can be.
fn keep_referenced_definitions(input: &Value, _top: &ObjectNode, out: &mut Value) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn strict(v: Value) -> Result<String, SchemaError> {
        normalize_strict(&v, Top::ToolParameters).map(|v| v.to_string())
    }

    #[test]
    fn objects_are_closed_and_fully_required() {
        let out = strict(
            json!({"type": "object", "properties": {"a": {"type": "string", "title": "A", "minLength": 1}}}),
        );
        assert_eq!(
            out.unwrap(),
            r#"{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false,"required":["a"]}"#
        );
    }

    #[test]
    fn strict_rules_report_official_messages() {
        let cases = [
            (
                json!({"type": "object", "properties": {"a": {"type": "object"}}}),
                "An object with no properties is not allowed.",
            ),
            (
                json!({"type": "object", "additionalProperties": true}),
                "additionalProperties should not be true",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "a"]}),
                "Duplicate required property 'a'",
            ),
            (
                json!({"type": "string"}),
                "The top level of the function parameters schema must be an object.",
            ),
        ];
        for (schema, msg) in cases {
            assert_eq!(strict(schema), Err(SchemaError::Rule(msg.into())));
        }
        assert_eq!(
            strict(json!({"type": "object", "properties": {"a": {"allOf": []}}})),
            Err(SchemaError::Shape(
                "one of `type`, `anyOf`, `$ref` field is required".into()
            ))
        );
    }

    #[test]
    fn referenced_definitions_are_kept() {
        let out = strict(json!({
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/X"}},
            "$defs": {"X": {"type": "object", "properties": {"q": {"type": "string"}}}, "Unused": {"type": "string"}}
        }))
        .unwrap();
        assert!(out.contains(r#""$defs":{"X":{"type":"object","properties":{"q":{"type":"string"}},"additionalProperties":false,"required":["q"]}}"#), "{out}");
        assert!(!out.contains("Unused"));
    }
}
