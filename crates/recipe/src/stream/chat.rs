//! Chat Completions chunk generator.

use std::sync::Arc;

use super::generator::{render_args, ChunkGenerator, Ending, StartInfo};
use super::ids;
use super::parser::Arg;
use super::TokenLogprobs;
use crate::request::{ConversationRequest, ThinkingInitialStage};
use crate::response::{ChatCompletionChunk, ChatDelta, ChatHead, LogprobField, Usage};

#[derive(Clone, Debug)]
pub struct ChatCompletionChunkGenerator {
    id: String,
    model: String,
    created: u64,
    /// The response carries `reasoning_content` (thinking mode).
    thinking: bool,
    /// A prefix continuation of content: the first delta has a null reasoning field.
    continuation: bool,
    usage_null: bool,
    head: Option<Arc<ChatHead>>,
    calls: usize,
    reasoning_seen: bool,
}

impl ChatCompletionChunkGenerator {
    /// `usage_null`: chunks without usage carry `"usage":null` (not streaming, or streaming with
    /// `stream_options.include_usage`).
    pub fn new(
        id: String,
        model: String,
        thinking: bool,
        continuation: bool,
        usage_null: bool,
    ) -> Self {
        ChatCompletionChunkGenerator {
            id,
            model,
            created: ids::unix_now(),
            thinking,
            continuation,
            usage_null,
            head: None,
            calls: 0,
            reasoning_seen: false,
        }
    }

    /// The generator for a converted Chat Completions request.
    pub fn for_request(request: &ConversationRequest, id: String, model: String) -> Self {
        let continuation = request.parsing_options.thinking_initial_stage
            == Some(ThinkingInitialStage::ContentContinuation);
        let usage_null = !request.stream || request.output.include_usage;
        Self::new(
            id,
            model,
            request.conversation.thinking_mode,
            continuation,
            usage_null,
        )
    }

    fn head(&mut self) -> Arc<ChatHead> {
        match &self.head {
            Some(h) => Arc::clone(h),
            None => {
                let h = Arc::new(ChatHead {
                    id: self.id.clone(),
                    model: self.model.clone(),
                    created: self.created,
                    system_fingerprint: None,
                    usage_null: self.usage_null,
                });
                self.head = Some(Arc::clone(&h));
                h
            }
        }
    }

    fn chunk(
        &mut self,
        delta: ChatDelta,
        logprobs: Option<(LogprobField, Vec<TokenLogprobs>)>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            head: self.head(),
            delta,
            logprobs,
            finish_reason: None,
            usage: None,
        }
    }
}

impl ChunkGenerator for ChatCompletionChunkGenerator {
    type Event = ChatCompletionChunk;

    fn start(&mut self, info: &StartInfo, out: &mut Vec<ChatCompletionChunk>) {
        self.head = Some(Arc::new(ChatHead {
            id: self.id.clone(),
            model: self.model.clone(),
            created: self.created,
            system_fingerprint: info.system_fingerprint.clone(),
            usage_null: self.usage_null,
        }));
        let delta = ChatDelta::Role {
            thinking: self.thinking,
            continuation: self.continuation,
        };
        out.push(self.chunk(delta, None));
    }

    fn reasoning(
        &mut self,
        text: String,
        logprobs: Option<Vec<TokenLogprobs>>,
        out: &mut Vec<ChatCompletionChunk>,
    ) {
        self.reasoning_seen |= !text.is_empty();
        let lp = logprobs.map(|l| (LogprobField::Reasoning, l));
        out.push(self.chunk(ChatDelta::Reasoning(text), lp));
    }

    fn content(
        &mut self,
        text: String,
        logprobs: Option<Vec<TokenLogprobs>>,
        out: &mut Vec<ChatCompletionChunk>,
    ) {
        let lp = logprobs.map(|l| (LogprobField::Content, l));
        let thinking = self.thinking;
        out.push(self.chunk(ChatDelta::Content { text, thinking }, lp));
    }

    fn tool_start(&mut self, name: String, out: &mut Vec<ChatCompletionChunk>) {
        let index = self.calls;
        self.calls += 1;
        let id = ids::call_id(index, self.thinking && !self.reasoning_seen);
        out.push(self.chunk(ChatDelta::ToolStart { index, id, name }, None));
    }

    fn tool_args(&mut self, args: &[Arg], out: &mut Vec<ChatCompletionChunk>) {
        if self.calls == 0 {
            return;
        }
        let mut arguments = String::new();
        render_args(args, &mut arguments);
        if arguments.is_empty() {
            return;
        }
        let index = self.calls - 1;
        out.push(self.chunk(ChatDelta::ToolArgs { index, arguments }, None));
    }

    fn finish(&mut self, ending: Ending<'_>, usage: Usage, out: &mut Vec<ChatCompletionChunk>) {
        let reason = match ending {
            Ending::Stop if self.calls > 0 => "tool_calls",
            Ending::Stop | Ending::StopSequence(_) => "stop",
            Ending::Length => "length",
            Ending::ContentFilter => "content_filter",
        };
        let thinking = self.thinking;
        let mut chunk = self.chunk(ChatDelta::Final { thinking }, None);
        chunk.finish_reason = Some(reason);
        chunk.usage = Some(usage);
        out.push(chunk);
    }
}
