//! The fixed texts of the DeepSeek V4 / V4.1 prompt format (see shared/reference/prompt-templates.txt).
//!
//! Markers in braces are expanded by the renderer: `{D}` is the DSML special token, `{T}` / `{/T}`
//! the thinking tokens, and `{CALLS}`, `{INVOKE}`, `{PARAM}` the version's DSML tag names.

pub(crate) const TOOLS_BLOCK: &str = "## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<{D}{CALLS}>\" block like the following:

<{D}{CALLS}>
<{D}{INVOKE} name=\"$TOOL_NAME\">
<{D}{PARAM} name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{D}{PARAM}>
...
</{D}{INVOKE}>
<{D}{INVOKE} name=\"$TOOL_NAME2\">
...
</{D}{INVOKE}>
</{D}{CALLS}>

String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.

If thinking_mode is enabled (triggered by {T}), you MUST output your complete reasoning inside {T}...{/T} BEFORE any tool calls or final response.

Otherwise, output directly after {/T} with tool calls or final response.

### Available Tool Schemas

";

pub(crate) const TOOLS_FOOTER: &str =
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

pub(crate) const UPDATED_TOOLS_HEADER: &str = "\n\n### Updated Tool Schemas\n\n";

/// V4 preamble for effort None / high / xhigh.
pub(crate) const V4_EFFORT_ABSOLUTE: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.";

/// V4 preamble for effort max.
pub(crate) const V4_EFFORT_BEYOND: &str = "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.
You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose the problem into its most fundamental components, trace every causal chain to its root, and resolve the underlying cause rather than any surface symptom.
Do not stop reasoning until you have independently verified the solution from multiple angles and are certain that no assumption remains unchecked and no error remains undiscovered.";

/// V4.1 effort line; `{N}` is 50, 75 or 100.
/// The V4.1 effort line for effort 50, 100 and 75 (written out: it is on every thinking prompt).
pub(crate) const V41_EFFORT_LOW: &str =
    "Reasoning Effort: 50 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
pub(crate) const V41_EFFORT_MAX: &str =
    "Reasoning Effort: 100 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
pub(crate) const V41_EFFORT_DEFAULT: &str =
    "Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

pub(crate) const V4_JSON_OBJECT: &str =
    "\n\nYou are a helpful assistant designed to output JSON.\n## Response Format:\n\nReply with JSON object ONLY.";

pub(crate) const SCHEMA_PREFIX: &str =
    "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

pub(crate) const V41_JSON_OBJECT_SCHEMA: &str = "{\"type\": \"json_object\"}";
