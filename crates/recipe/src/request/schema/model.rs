//! The typed model strict normalisation reads a schema into: one node kind per `type`, plus
//! `anyOf` and `$ref` nodes, read in the key order of the input.

use serde::de::{Error as _, Unexpected};
use serde::{Deserialize, Deserializer};
use serde_json::{Number, Value};

#[derive(Debug, Clone)]
pub(super) enum Node {
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
pub(super) struct Described {
    pub(super) description: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct ObjectNode {
    pub(super) properties: Option<Props>,
    pub(super) required: Option<Vec<String>>,
    #[serde(rename = "additionalProperties")]
    pub(super) additional_properties: Option<bool>,
    pub(super) description: Option<String>,
}

/// Properties in document order, each read as a node where it appears (so a bad property is
/// reported before a bad keyword that follows it).
#[derive(Debug, Clone, Default)]
pub(super) struct Props(pub(super) Vec<(String, Node)>);

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
pub(super) enum Format {
    Email,
    Hostname,
    Ipv4,
    Ipv6,
    Uuid,
}

impl Format {
    pub(super) fn as_str(&self) -> &'static str {
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
pub(super) struct StringNode {
    pub(super) description: Option<String>,
    pub(super) pattern: Option<String>,
    pub(super) format: Option<Format>,
    #[serde(rename = "enum")]
    pub(super) enumeration: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct NumberNode {
    pub(super) description: Option<String>,
    #[serde(rename = "const")]
    pub(super) constant: Option<Number>,
    pub(super) default: Option<Number>,
    pub(super) minimum: Option<Number>,
    pub(super) maximum: Option<Number>,
    #[serde(rename = "exclusiveMinimum")]
    pub(super) exclusive_minimum: Option<Number>,
    #[serde(rename = "exclusiveMaximum")]
    pub(super) exclusive_maximum: Option<Number>,
    #[serde(rename = "multipleOf")]
    pub(super) multiple_of: Option<Number>,
}

/// Integer keywords are read as i64 (a fractional bound is an error, as in the official).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct IntegerNode {
    pub(super) description: Option<String>,
    #[serde(rename = "const")]
    pub(super) constant: Option<i64>,
    pub(super) default: Option<i64>,
    pub(super) minimum: Option<i64>,
    pub(super) maximum: Option<i64>,
    #[serde(rename = "exclusiveMinimum")]
    pub(super) exclusive_minimum: Option<i64>,
    #[serde(rename = "exclusiveMaximum")]
    pub(super) exclusive_maximum: Option<i64>,
    #[serde(rename = "multipleOf")]
    pub(super) multiple_of: Option<i64>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct ArrayNode {
    pub(super) items: Box<Node>,
    pub(super) description: Option<String>,
}

/// `anyOf` alternatives must be typed schemas; errors inside read `field `anyOf`: ...`.
#[derive(Debug, Clone)]
pub(super) struct AnyOfNode {
    pub(super) any_of: Vec<Node>,
    pub(super) description: Option<String>,
}

#[derive(Debug, Clone)]
pub(super) struct RefNode {
    pub(super) reference: String,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Primitive {
    String,
    Number,
    Integer,
    Boolean,
    Null,
}

impl Primitive {
    pub(super) fn as_str(self) -> &'static str {
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

/// What serde names a JSON value in its "invalid type" messages.
pub(crate) fn unexpected(v: &Value) -> Unexpected<'_> {
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
