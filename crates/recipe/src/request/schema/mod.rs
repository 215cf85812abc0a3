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

mod defs;
mod model;
mod strict;
#[cfg(test)]
mod tests;

use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use defs::keep_referenced_definitions;
pub(crate) use model::unexpected;
use model::Node;
use strict::validate;

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
