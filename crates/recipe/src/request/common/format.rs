//! The requested response format.

use serde_json::Value;

use super::{bad, Result};
use crate::conversation::{Message, ResponseFormat};
use crate::request::schema::{self, SchemaError, Top};

/// A requested response format before its schema is checked.
#[derive(Clone, Debug)]
pub(crate) enum FormatSpec {
    Text,
    JsonObject,
    JsonSchema { schema: Value, strict: bool },
    Regex(String),
}

/// The conversation's response format and the schema the output constraint carries.
pub(crate) fn finalize_format(spec: FormatSpec) -> Result<(ResponseFormat, Option<String>)> {
    Ok(match spec {
        FormatSpec::Text => (ResponseFormat::Text, None),
        FormatSpec::JsonObject => (ResponseFormat::JsonObject, Some(String::new())),
        FormatSpec::Regex(r) => (ResponseFormat::Regex(r), None),
        FormatSpec::JsonSchema { schema, strict } => {
            let constraint = if strict {
                schema::normalize_strict(&schema, Top::ResponseFormat).map_err(|e| match e {
                    SchemaError::Shape(m) => bad(format!("Invalid json schema: {m}")),
                    SchemaError::Rule(m) => bad(m),
                })?
            } else {
                schema::meta_validate(&schema)
                    .map_err(|m| bad(format!("Invalid json schema: {m}")))?;
                schema.clone()
            };
            (
                ResponseFormat::JsonSchema(schema),
                Some(constraint.to_string()),
            )
        }
    })
}

/// Does any message mention "json" (any case)?
pub(crate) fn mentions_json(messages: &[Message]) -> bool {
    messages
        .iter()
        .any(|m| m.content.to_ascii_lowercase().contains("json"))
}
