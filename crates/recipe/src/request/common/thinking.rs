//! Thinking mode, reasoning effort, and the reasoning of assistant messages in history.

use super::{bad, Result};
use crate::conversation::{Message, ReasoningEffort, Role};
use crate::request::options::{ConversionOptions, ReasoningContentBehavior};

/// The thinking switch and effort as the request asks for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Effort {
    None,
    Low,
    High,
    XHigh,
    Max,
}

/// Thinking mode: an explicit switch wins; else an effort of `none` turns it off and any other
/// effort on; else the configured default. The effort applies only in thinking mode.
pub(crate) fn resolve_thinking(
    switch: Option<bool>,
    effort: Option<Effort>,
    options: &ConversionOptions,
) -> (bool, Option<ReasoningEffort>) {
    let thinking = switch.unwrap_or(match effort {
        Some(Effort::None) => false,
        Some(_) => true,
        None => options.default_thinking_mode,
    });
    let effort = thinking.then_some(match effort {
        Some(Effort::Low) => ReasoningEffort::Low,
        Some(Effort::XHigh) => ReasoningEffort::XHigh,
        Some(Effort::Max) => ReasoningEffort::Max,
        _ => ReasoningEffort::High,
    });
    (thinking, effort)
}

/// Reasoning in history: dropped outside thinking mode; in thinking mode a missing one is filled
/// with "" or, with `Reject`, refused where it must be passed back: on an assistant message after
/// the last user message that makes tool calls or is answered while tools are declared.
pub(crate) fn apply_reasoning_policy(
    messages: &mut [Message],
    thinking: bool,
    has_tools: bool,
    options: &ConversionOptions,
    field: &str,
) -> Result<()> {
    let last_user = messages.iter().rposition(|m| m.role == Role::User);
    for (i, m) in messages.iter_mut().enumerate() {
        if m.role != Role::Assistant {
            continue;
        }
        if !thinking {
            m.reasoning_content = None;
            continue;
        }
        if m.reasoning_content.is_none() {
            let in_loop = last_user.is_none_or(|u| i > u) && (has_tools || m.tool_calls.is_some());
            if options.reasoning_content_behavior == ReasoningContentBehavior::Reject && in_loop {
                return Err(bad(format!(
                    "The `{field}` in the thinking mode must be passed back to the API."
                )));
            }
            m.reasoning_content = Some(String::new());
        }
    }
    Ok(())
}
