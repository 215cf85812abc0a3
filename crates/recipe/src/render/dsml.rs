//! Tool calls in assistant history, written as a DSML block.

use serde_json::Value;

use super::builder::{DsmlTags, PromptBuilder};
use super::{parse_arguments, ModelVersion};
use crate::conversation::ToolCall;
use crate::pyjson::{self, NumberStyle};
use crate::special::SpecialToken;

pub(crate) fn tool_calls_block(
    b: &mut PromptBuilder<'_>,
    calls: &[ToolCall],
    tags: &DsmlTags,
    style: NumberStyle,
    version: ModelVersion,
) {
    b.text("\n\n<");
    b.special(SpecialToken::Dsml);
    b.text(tags.calls);
    b.text(">\n");
    // V4 writes the calls ordered by id (a stable sort); V4.1 keeps the given order.
    let mut ordered: Vec<&ToolCall> = calls.iter().collect();
    if version == ModelVersion::DeepseekV4Pro {
        ordered.sort_by(|a, b| a.id.cmp(&b.id));
    }
    for call in ordered {
        b.text("<");
        b.special(SpecialToken::Dsml);
        b.text(tags.invoke);
        b.text(" name=\"");
        b.text(&call.name);
        b.text("\">\n");
        let mut count = 0;
        match parse_arguments(&call.arguments) {
            Some(map) => {
                for (key, value) in &map {
                    parameter(b, tags, key, value, style);
                    count += 1;
                }
            }
            None => {
                parameter(
                    b,
                    tags,
                    "arguments",
                    &Value::String(call.arguments.clone()),
                    style,
                );
                count += 1;
            }
        }
        if count == 0 && version == ModelVersion::DeepseekV41Flash {
            b.text("\n");
        }
        b.text("</");
        b.special(SpecialToken::Dsml);
        b.text(tags.invoke);
        b.text(">\n");
    }
    b.text("</");
    b.special(SpecialToken::Dsml);
    b.text(tags.calls);
    b.text(">");
}

/// Strings go in raw with `string="true"`; every other JSON value is re-serialised.
fn parameter(
    b: &mut PromptBuilder<'_>,
    tags: &DsmlTags,
    key: &str,
    value: &Value,
    style: NumberStyle,
) {
    b.text("<");
    b.special(SpecialToken::Dsml);
    b.text(tags.parameter);
    b.text(" name=\"");
    b.text(key);
    match value {
        Value::String(s) => {
            b.text("\" string=\"true\">");
            b.text(s);
        }
        other => {
            b.text("\" string=\"false\">");
            b.text(&pyjson::to_string(other, style));
        }
    }
    b.text("</");
    b.special(SpecialToken::Dsml);
    b.text(tags.parameter);
    b.text(">\n");
}
