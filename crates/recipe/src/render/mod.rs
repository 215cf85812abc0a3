//! Rendering a [`Conversation`] into a DeepSeek V4 or V4.1 prompt with special ranges.
//!
//! The two versions share the turn structure and differ in the places listed on
//! [`ModelVersion`]; every difference below was observed on deepseek-recipe 0.2.0 and is pinned by
//! the recorded vectors and the render conformance suite.

mod builder;
mod dsml;
mod templates;

use builder::{DsmlTags, PromptBuilder, V41_TAGS, V4_TAGS};
use serde_json::Value;

use crate::conversation::{
    Conversation, ImageSource, Message, ReasoningEffort, ResponseFormat, Role, ToolChoice,
    ToolDefinition,
};
use crate::pyjson::{self, NumberStyle};
use crate::special::{SpecialToken, SpecialTokens};

/// The prompt format a conversation is rendered in.
///
/// - V4 hoists every system message into the head (V4.1 opens a `<｜System｜>` turn in place),
///   never renders deferred tools or a system message's tools, writes small floats positionally
///   down to 1e-5, and starts a new user turn for tool results that follow a user message.
/// - V4.1 writes the effort as a number, spells DSML tags with a leading space (` calls`),
///   keeps history reasoning only in thinking mode, and closes an empty invoke with a blank line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelVersion {
    DeepseekV4Pro,
    DeepseekV41Flash,
}

impl ModelVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelVersion::DeepseekV4Pro => "DeepseekV4Pro",
            ModelVersion::DeepseekV41Flash => "DeepseekV41Flash",
        }
    }

    fn tags(self) -> &'static DsmlTags {
        match self {
            ModelVersion::DeepseekV4Pro => &V4_TAGS,
            ModelVersion::DeepseekV41Flash => &V41_TAGS,
        }
    }

    fn number_style(self) -> NumberStyle {
        match self {
            ModelVersion::DeepseekV4Pro => NumberStyle::V4,
            ModelVersion::DeepseekV41Flash => NumberStyle::PythonRepr,
        }
    }

    /// The DSML tag that opens a tool-call block (`tool_calls` / ` calls`).
    pub fn calls_tag(self) -> &'static str {
        self.tags().calls
    }
}

/// A rendered prompt. `special_ranges` are byte offsets, ascending and disjoint; each spans the
/// spelling of one special token.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderedPrompt {
    pub prompt: String,
    pub special_ranges: Vec<(usize, usize)>,
    pub image_sources: Vec<ImageSource>,
}

/// A prompt encoding: a model version plus the special-token spellings it renders with.
#[derive(Clone, Debug, PartialEq)]
pub struct Encoding {
    pub version: ModelVersion,
    pub special_tokens: SpecialTokens,
}

impl Encoding {
    pub fn new(version: ModelVersion) -> Self {
        Encoding {
            version,
            special_tokens: SpecialTokens::default(),
        }
    }

    pub fn render(&self, conversation: &Conversation) -> RenderedPrompt {
        let capacity = conversation
            .messages
            .iter()
            .map(|m| m.content.len() + m.reasoning_content.as_ref().map_or(0, String::len) + 32)
            .sum::<usize>()
            + 256;
        let mut r = Renderer {
            b: PromptBuilder::new(&self.special_tokens, capacity),
            conv: conversation,
            version: self.version,
            tags: self.version.tags(),
            style: self.version.number_style(),
            tools_active: !conversation.tools.is_empty()
                && conversation.tool_choice != ToolChoice::None,
        };
        r.render();
        RenderedPrompt {
            prompt: r.b.prompt,
            special_ranges: r.b.ranges,
            image_sources: r.b.images,
        }
    }
}

struct Renderer<'a> {
    b: PromptBuilder<'a>,
    conv: &'a Conversation,
    version: ModelVersion,
    tags: &'static DsmlTags,
    style: NumberStyle,
    /// A tools block is rendered and history reasoning may be shown.
    tools_active: bool,
}

impl Renderer<'_> {
    fn v4(&self) -> bool {
        self.version == ModelVersion::DeepseekV4Pro
    }

    fn render(&mut self) {
        self.b.special(SpecialToken::Bos);
        let messages = &self.conv.messages;
        // (index in the conversation, message) of every message rendered as a turn; V4.1 counts a
        // synthesised head system message.
        let mut turns: Vec<(usize, &Message)> = if self.v4() {
            self.v4_head();
            messages
                .iter()
                .enumerate()
                .filter(|(_, m)| m.role != Role::System)
                .collect()
        } else {
            let (consumed, synthesised) = self.v41_head();
            let shift = usize::from(synthesised);
            messages
                .iter()
                .enumerate()
                .skip(usize::from(consumed))
                .map(|(i, m)| (i + shift, m))
                .collect()
        };
        sort_tool_results(&mut turns, self.version);
        self.turns(&turns);
        let ends_in_prefix = turns
            .last()
            .is_some_and(|(_, m)| m.role == Role::Assistant && m.prefix);
        if !ends_in_prefix {
            self.b.special(SpecialToken::Assistant);
            self.b.special(if self.conv.thinking_mode {
                SpecialToken::ThinkingStart
            } else {
                SpecialToken::ThinkingEnd
            });
        }
        // A required tool choice opens the call block, after a prefix continuation too.
        if self.tools_active && self.conv.tool_choice == ToolChoice::Required {
            self.open_calls_block();
        }
    }

    /// V4 head: effort preamble, all system messages joined, tools block, response format.
    fn v4_head(&mut self) {
        if self.conv.thinking_mode {
            let preamble = match self.conv.reasoning_effort {
                Some(ReasoningEffort::Low) => None,
                Some(ReasoningEffort::Max) => Some(templates::V4_EFFORT_BEYOND),
                _ => Some(templates::V4_EFFORT_ABSOLUTE),
            };
            if let Some(p) = preamble {
                self.b.text(p);
                self.b.text("\n\n");
            }
        }
        let mut first = true;
        for m in self.conv.messages.iter().filter(|m| m.role == Role::System) {
            if m.content.is_empty() {
                continue;
            }
            if !first {
                self.b.text("\n\n");
            }
            first = false;
            self.b.content(m);
        }
        if self.tools_active {
            self.b.text("\n\n");
            self.tools_block();
        }
        self.response_format();
    }

    /// V4.1 head: a `<｜System｜>` turn holding the effort line, the first system message, the
    /// tools block and the response format, when any of them is present. Returns whether the first
    /// message was consumed, and whether a system message was synthesised for tools or format (it
    /// shifts the message indices the prefix rule of [`Renderer::assistant`] looks at).
    fn v41_head(&mut self) -> (bool, bool) {
        let first_system = self
            .conv
            .messages
            .first()
            .filter(|m| m.role == Role::System);
        let format_renders = matches!(
            self.conv.response_format,
            ResponseFormat::JsonObject | ResponseFormat::JsonSchema(_)
        );
        // The head is written in front of the first message, so an empty conversation has none.
        // The effort line alone opens a head only in front of a first message.
        let effort_head = self.conv.thinking_mode && !self.conv.messages.is_empty();
        let synthesised = first_system.is_none() && (self.tools_active || format_renders);
        if first_system.is_none() && !effort_head && !synthesised {
            return (false, false);
        }
        self.b.special(SpecialToken::System);
        if self.conv.thinking_mode {
            let line = match self.conv.reasoning_effort {
                Some(ReasoningEffort::Low) => templates::V41_EFFORT_LOW,
                Some(ReasoningEffort::Max) => templates::V41_EFFORT_MAX,
                _ => templates::V41_EFFORT_DEFAULT,
            };
            self.b.text(line);
        }
        if let Some(m) = first_system {
            self.b.content(m);
        }
        if self.tools_active {
            self.b.text("\n\n");
            self.tools_block();
        }
        self.response_format();
        if let Some(tools) = first_system.and_then(|m| m.tools.as_ref()) {
            self.updated_tools(tools);
        }
        (first_system.is_some(), synthesised)
    }

    fn turns(&mut self, turns: &[(usize, &Message)]) {
        // Consecutive user and tool messages form one user turn.
        let mut user_turn: Vec<&Message> = Vec::with_capacity(4);
        let mut prev: Option<Role> = None;
        let last = turns.len().saturating_sub(1);
        for (i, &(index, m)) in turns.iter().enumerate() {
            match m.role {
                Role::User | Role::Tool => {
                    // V4 starts a new user turn for tool results that follow a user message.
                    if self.v4() && m.role == Role::Tool && prev == Some(Role::User) {
                        self.user_turn(&mut user_turn);
                    }
                    user_turn.push(m);
                }
                role => {
                    self.user_turn(&mut user_turn);
                    match role {
                        Role::System => {
                            self.b.special(SpecialToken::System);
                            self.b.content(m);
                            if let Some(tools) = &m.tools {
                                self.updated_tools(tools);
                            }
                        }
                        // V4.1 keeps only the first of consecutive reminders.
                        Role::LatestReminder if !self.v4() && prev == Some(role) => {}
                        Role::LatestReminder => {
                            self.b.special(SpecialToken::LatestReminder);
                            self.b.content(m);
                        }
                        _ => self.assistant(m, index, i == last),
                    }
                }
            }
            prev = Some(m.role);
        }
        self.user_turn(&mut user_turn);
    }

    /// Write and clear a pending user turn: tool results wrapped in `<tool_result>` and user
    /// messages, joined by blank lines. V4 first merges each run of consecutive user messages into
    /// one part, leaving out the empty ones (their images still count).
    fn user_turn(&mut self, parts: &mut Vec<&Message>) {
        if parts.is_empty() {
            return;
        }
        self.b.special(SpecialToken::User);
        let mut i = 0;
        while i < parts.len() {
            if i > 0 {
                self.b.text("\n\n");
            }
            let m = parts[i];
            if m.role == Role::Tool {
                self.b.text("<tool_result>");
                self.b.content(m);
                self.b.text("</tool_result>");
                i += 1;
            } else if self.v4() {
                let mut first = true;
                while i < parts.len() && parts[i].role == Role::User {
                    let u = parts[i];
                    if u.content.is_empty() {
                        self.b.images.extend(u.image_sources.iter().cloned());
                    } else {
                        if !first {
                            self.b.text("\n\n");
                        }
                        first = false;
                        self.b.content(u);
                    }
                    i += 1;
                }
            } else {
                self.b.content(m);
                i += 1;
            }
        }
        parts.clear();
    }

    fn assistant(&mut self, m: &Message, index: usize, is_last: bool) {
        use SpecialToken::{Eos, ThinkingEnd, ThinkingStart};
        self.b.special(SpecialToken::Assistant);
        let reasoning = m.reasoning_content.as_deref();
        let thinking = self.conv.thinking_mode;
        if self.v4() {
            if m.prefix && thinking && m.content.is_empty() {
                // Reasoning continuation: the model goes on thinking.
                if let Some(r) = reasoning {
                    self.b.special(ThinkingStart);
                    self.b.text(r);
                }
            } else {
                let show = m.prefix || self.tools_active;
                match reasoning.filter(|_| show) {
                    Some(r) => {
                        self.b.special(ThinkingStart);
                        self.b.text(r);
                        self.b.special(ThinkingEnd);
                    }
                    None => self.b.special(ThinkingEnd),
                }
                self.b.content(m);
            }
        } else if thinking && ((m.prefix && index > 0) || self.tools_active) {
            // V4.1 shows a prefix's reasoning only when something precedes it.
            self.b.special(ThinkingStart);
            self.b.text(reasoning.unwrap_or(""));
            let has_calls = m.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
            // An empty prefix continues the reasoning, unless it carries tool calls.
            if !(m.prefix && m.content.is_empty() && !has_calls) {
                self.b.special(ThinkingEnd);
                self.b.content(m);
            }
        } else {
            self.b.special(ThinkingEnd);
            self.b.content(m);
        }
        // V4 writes a block even for an empty call list; V4.1 only for calls.
        if let Some(calls) = m.tool_calls.as_ref().filter(|c| self.v4() || !c.is_empty()) {
            dsml::tool_calls_block(&mut self.b, calls, self.tags, self.style, self.version);
        }
        let closes = if self.v4() {
            !(m.prefix && is_last)
        } else {
            !m.prefix
        };
        if closes {
            self.b.special(Eos);
        }
    }

    fn open_calls_block(&mut self) {
        self.b.text("\n\n<");
        self.b.special(SpecialToken::Dsml);
        self.b.text(self.tags.calls);
        self.b.text(">\n");
    }

    fn tools_block(&mut self) {
        self.b.template(templates::TOOLS_BLOCK, self.tags);
        let lines: Vec<String> = self
            .conv
            .tools
            .iter()
            .filter(|t| !t.defer_loading)
            .map(|t| tool_line(t, self.style))
            .collect();
        if self.v4() {
            for l in &lines {
                self.b.text(l);
                self.b.text("\n");
            }
            self.b.text("\n");
        } else {
            self.b.text(&lines.join("\n"));
            self.b.text("\n\n");
        }
        self.b.text(templates::TOOLS_FOOTER);
    }

    /// V4.1's in-place tool update of a system message; V4 ignores it.
    fn updated_tools(&mut self, tools: &[ToolDefinition]) {
        if self.v4() || tools.is_empty() {
            return;
        }
        self.b.text(templates::UPDATED_TOOLS_HEADER);
        let lines: Vec<String> = tools.iter().map(|t| tool_line(t, self.style)).collect();
        self.b.text(&lines.join("\n"));
    }

    fn response_format(&mut self) {
        match &self.conv.response_format {
            ResponseFormat::JsonObject if self.v4() => self.b.text(templates::V4_JSON_OBJECT),
            ResponseFormat::JsonObject => {
                self.b.text(templates::SCHEMA_PREFIX);
                self.b.text(templates::V41_JSON_OBJECT_SCHEMA);
            }
            ResponseFormat::JsonSchema(schema) => {
                self.b.text(templates::SCHEMA_PREFIX);
                self.b.text(&pyjson::to_string(schema, self.style));
            }
            ResponseFormat::Text | ResponseFormat::Regex(_) => {}
        }
    }
}

/// Tool results are written in the order of the calls they answer (V4 writes the calls themselves
/// ordered by id): the run of tool messages right after an assistant with calls is stably sorted
/// by the position of its `tool_call_id` among the written calls (unknown ids last).
fn sort_tool_results(turns: &mut [(usize, &Message)], version: ModelVersion) {
    let mut i = 0;
    while i < turns.len() {
        let Some(calls) = turns[i].1.tool_calls.as_ref().filter(|c| !c.is_empty()) else {
            i += 1;
            continue;
        };
        let mut order: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
        if version == ModelVersion::DeepseekV4Pro {
            order.sort();
        }
        let start = i + 1;
        let mut end = start;
        while end < turns.len() && end - start < calls.len() && turns[end].1.role == Role::Tool {
            end += 1;
        }
        let rank = |m: &Message| {
            m.tool_call_id
                .as_deref()
                .and_then(|id| order.iter().position(|o| *o == id))
                .unwrap_or(usize::MAX)
        };
        turns[start..end].sort_by_key(|(_, m)| rank(m));
        i = end;
    }
}

/// `{"name": N, "description": D, "parameters": P}` in Python JSON style.
fn tool_line(tool: &ToolDefinition, style: NumberStyle) -> String {
    let mut out = String::from("{\"name\": ");
    pyjson::write_string(&mut out, &tool.name);
    out.push_str(", \"description\": ");
    pyjson::write_string(&mut out, tool.description.as_deref().unwrap_or(""));
    out.push_str(", \"parameters\": ");
    pyjson::write_value(&mut out, &tool.parameters, style);
    out.push('}');
    out
}

/// Parse a tool call's arguments the way the renderer shows them: the entries of a JSON object,
/// or `None` for anything else (shown as one raw `arguments` string parameter).
pub(crate) fn parse_arguments(arguments: &str) -> Option<serde_json::Map<String, Value>> {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}
