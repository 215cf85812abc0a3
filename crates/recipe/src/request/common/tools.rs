//! Declared tools: names, schemas, and the tool choice applied to them.

use serde_json::{json, Value};

use super::{bad, Result};
use crate::conversation::{ToolChoice, ToolDefinition};
use crate::request::schema::{self, SchemaError, Top};

pub(crate) fn check_tool_name(name: &str, path: &str) -> Result<()> {
    if name.is_empty() {
        return Err(bad(format!(
            "Invalid '{path}': empty string. Expected a string with minimum length 1, but got an empty string instead."
        )));
    }
    let ok = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(bad(format!(
            "Invalid '{path}': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
        )))
    }
}

/// A declared tool before its schema is checked.
#[derive(Clone, Debug)]
pub(crate) struct ToolSpec {
    pub name: String,
    pub description: Option<String>,
    /// `None` when the request gave no schema (or `null`).
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
    pub defer_loading: bool,
}

/// Check names are unique and schemas valid, normalising strict ones, tool by tool. With
/// `tool_choice: none` the tools are dropped unchecked.
pub(crate) fn finalize_tools(
    specs: Vec<ToolSpec>,
    choice: &ChoiceSpec,
) -> Result<Vec<ToolDefinition>> {
    if *choice == ChoiceSpec::None {
        return Ok(Vec::new());
    }
    let mut out: Vec<ToolDefinition> = Vec::with_capacity(specs.len());
    for spec in specs {
        if out.iter().any(|t| t.name == spec.name) {
            return Err(bad("Tool names must be unique."));
        }
        let parameters = tool_parameters(&spec)?;
        out.push(ToolDefinition {
            name: spec.name,
            description: spec.description,
            parameters,
            strict: spec.strict,
            defer_loading: spec.defer_loading,
        });
    }
    Ok(out)
}

fn tool_parameters(spec: &ToolSpec) -> Result<Value> {
    // Chat and Responses read a `null` schema as absent; Messages passes it on to be refused.
    let given = spec.parameters.as_ref();
    if spec.strict == Some(true) {
        let schema = given.cloned().unwrap_or_else(|| json!({"type": "object"}));
        return schema::normalize_strict(&schema, Top::ToolParameters).map_err(|e| match e {
            SchemaError::Shape(m) => bad(format!("Invalid tool parameters schema : {m}")),
            SchemaError::Rule(m) => bad(m),
        });
    }
    let Some(schema) = given else {
        return Ok(json!({}));
    };
    let name = &spec.name;
    schema::meta_validate(schema)
        .map_err(|m| bad(format!("Invalid schema for function '{name}': {m}")))?;
    let ty = schema.get("type").cloned().unwrap_or(Value::Null);
    if ty != Value::String("object".into()) {
        return Err(bad(format!(
            "Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"', got 'type: {ty}'."
        )));
    }
    Ok(schema.clone())
}

/// The requested tool choice before tools are known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ChoiceSpec {
    Auto,
    None,
    Required,
    Named(String),
}

/// Apply the tool choice to the tool list.
pub(crate) fn resolve_tool_choice(
    choice: ChoiceSpec,
    tools: &mut Vec<ToolDefinition>,
    thinking: bool,
) -> Result<ToolChoice> {
    const THINKING: &str = "Thinking mode does not support this tool_choice";
    Ok(match choice {
        ChoiceSpec::Auto => ToolChoice::Auto,
        ChoiceSpec::None => {
            tools.clear();
            ToolChoice::None
        }
        ChoiceSpec::Required if tools.is_empty() => ToolChoice::Auto,
        ChoiceSpec::Required => {
            if thinking {
                return Err(bad(THINKING));
            }
            ToolChoice::Required
        }
        ChoiceSpec::Named(_) if tools.is_empty() => ToolChoice::Auto,
        ChoiceSpec::Named(name) => {
            let Some(pos) = tools.iter().position(|t| t.name == name) else {
                return Err(bad(format!(
                    "Invalid value for 'tool_call': no function named '{name}' was specified in the 'tools' parameter."
                )));
            };
            if thinking {
                return Err(bad(THINKING));
            }
            let keep = tools.swap_remove(pos);
            tools.clear();
            tools.push(keep);
            ToolChoice::Required
        }
    })
}
