//! Messages request -> [`ConversationRequest`]: the request-level checks, in the official order.

use serde_json::Value;

use super::turns::{plain, unanswered, Walk};
use super::wire::{
    MessagesRequest, MessagesSystemBlock, MessagesTool, MessagesToolChoice, TextOrList,
    ThinkingKind,
};
use crate::conversation::{Message, ResponseFormat, Role, ToolDefinition};
use crate::error::{ConversionError, RecipeError};
use crate::render::ModelVersion;
use crate::request::common::{self, bad, ChoiceSpec, Effort, Resolved, Result, ToolSpec};
use crate::request::options::{ConversionOptions, WebSearchBehavior};
use crate::request::{
    parse_body, parse_body_boxed, ConversationRequest, OutputOptions, RequestBody,
};
use crate::special::SpecialToken;

impl MessagesRequest {
    pub fn from_body(body: RequestBody<'_>) -> std::result::Result<Self, RecipeError> {
        parse_body(body)
    }

    /// [`Self::from_body`], boxed (see [`parse_body_boxed`]).
    pub fn from_body_boxed(body: RequestBody<'_>) -> std::result::Result<Box<Self>, RecipeError> {
        parse_body_boxed(body)
    }

    /// Declared client tools. V4 has no deferred loading: its tools are all loaded up front.
    fn tool_specs(
        &self,
        options: &ConversionOptions,
        version: ModelVersion,
    ) -> Result<Vec<ToolSpec>> {
        let mut out = Vec::new();
        for (i, tool) in self.tools.iter().flatten().enumerate() {
            match tool {
                MessagesTool::Server(kind) => {
                    let web_search = kind.starts_with("web_search");
                    if web_search && options.messages_web_search == WebSearchBehavior::Drop {
                        continue;
                    }
                    return Err(bad(format!("tools[{i}]: server tools are not supported")));
                }
                MessagesTool::Client(t) => {
                    common::check_tool_name(&t.name, &format!("tools[{i}].name"))?;
                    out.push(ToolSpec {
                        name: t.name.clone(),
                        description: t.description.clone(),
                        parameters: Some(t.input_schema.clone().unwrap_or(Value::Null)),
                        strict: None,
                        defer_loading: version == ModelVersion::DeepseekV41Flash
                            && t.defer_loading.unwrap_or(false),
                    });
                }
            }
        }
        Ok(out)
    }

    pub fn convert(
        self,
        options: &ConversionOptions,
    ) -> std::result::Result<ConversationRequest, ConversionError> {
        let version = common::resolve_model(options, &self.model)?;
        let tool_specs = self.tool_specs(options, version)?;
        if !tool_specs.is_empty() && tool_specs.iter().all(|t| t.defer_loading) {
            return Err(bad(
                "tools: at least one tool must have defer_loading=false. All tools cannot be deferred.",
            ));
        }
        if self.messages.is_empty() {
            return Err(bad("messages: at least one message is required"));
        }
        let image_token = options.special_tokens.token(SpecialToken::Image);
        let mut walk = Walk {
            version,
            image_token,
            out: Vec::new(),
            pending: Vec::new(),
            pending_at: 0,
            additions: Vec::new(),
            declared: tool_specs.iter().map(|t| t.name.clone()).collect(),
        };
        match &self.system {
            None => {}
            Some(TextOrList::Text(s)) => walk.out.push(plain(Role::System, s.clone())),
            Some(TextOrList::List(blocks)) => {
                let texts: Vec<&str> = blocks
                    .iter()
                    .map(|MessagesSystemBlock::Text { text }| text.as_str())
                    .collect();
                walk.out.push(plain(Role::System, texts.join("\n\n")));
            }
        }
        for (i, message) in self.messages.iter().enumerate() {
            walk.message(i, message)?;
        }
        if !walk.pending.is_empty() {
            return Err(unanswered(
                &format!("messages.{}", walk.pending_at),
                "",
                &walk.pending,
            ));
        }
        let Walk {
            out: mut messages,
            additions,
            ..
        } = walk;

        let choice = match &self.tool_choice {
            None | Some(MessagesToolChoice::Auto { .. }) | Some(MessagesToolChoice::Any { .. }) => {
                ChoiceSpec::Auto
            }
            Some(MessagesToolChoice::None {}) => ChoiceSpec::None,
            Some(MessagesToolChoice::Tool { name, .. }) => ChoiceSpec::Named(name.clone()),
        };
        let declared = !tool_specs.is_empty();
        let switch = self.thinking.map(|t| t.kind != ThinkingKind::Disabled);
        let effort = self
            .output_config
            .as_ref()
            .and_then(|c| c.effort)
            .map(Effort::from);
        let (thinking, reasoning_effort) = common::resolve_thinking(switch, effort, options);
        common::apply_reasoning_policy(
            &mut messages,
            thinking,
            declared,
            options,
            "content[].thinking",
        )?;
        let mut tools = common::finalize_tools(tool_specs, &choice)?;
        let tool_choice = common::resolve_tool_choice(choice, &mut tools, thinking)?;
        attach_additions(&mut messages, &additions, &tools);

        let stop = self.stop_sequences.clone().unwrap_or_default();
        common::check_stop(&stop, false, "stop")?;
        common::check_temperature(self.temperature)?;
        common::check_top_p(self.top_p)?;
        let bound = if thinking {
            options.thinking_max_tokens_upper_bound
        } else {
            options.non_thinking_max_tokens_upper_bound
        };
        let max_tokens = self.max_tokens.map(|m| m.min(bound));
        common::check_max_tokens(max_tokens, thinking, options)?;

        Ok(common::assemble(
            Resolved {
                version,
                thinking,
                reasoning_effort,
                messages,
                tools,
                tool_choice,
                format: ResponseFormat::Text,
                format_constraint: None,
                stop_sequences: stop,
                max_tokens,
                temperature: self.temperature,
                top_p: self.top_p,
                logprobs: false,
                top_logprobs: None,
                seed: None,
                stream: self.stream.unwrap_or(false),
                output: OutputOptions::default(),
            },
            options,
        ))
    }
}

/// Give each system message the (final) definitions of the tools its `tool_addition` blocks
/// name. A system message that was only there to add tools, none of which remain (`tool_choice`
/// dropped them), is removed.
fn attach_additions(
    messages: &mut Vec<Message>,
    additions: &[(usize, Vec<String>)],
    tools: &[ToolDefinition],
) {
    for (at, names) in additions.iter().rev() {
        let defs: Vec<ToolDefinition> = names
            .iter()
            .filter_map(|n| tools.iter().find(|t| &t.name == n).cloned())
            .collect();
        let Some(m) = messages.get_mut(*at) else {
            continue;
        };
        if defs.is_empty() && m.content.is_empty() && m.image_sources.is_empty() {
            messages.remove(*at);
        } else {
            m.tools = Some(defs);
        }
    }
}
