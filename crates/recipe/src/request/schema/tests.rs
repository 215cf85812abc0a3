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
