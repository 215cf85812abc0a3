//! Messages event generator.
//!
//! In thinking mode the thinking block opens at the start (before any output) and is still sent
//! when the model produced no reasoning. A block closes when the next one opens or at the end; a
//! thinking block closes with its signature (the response id unless `with_signature`). One
//! `ping` follows the first `content_block_start`.

use std::sync::Arc;

use super::generator::{render_args, ChunkGenerator, Ending, StartInfo};
use super::ids;
use super::parser::Arg;
use super::TokenLogprobs;
use crate::request::ConversationRequest;
use crate::response::{BlockDelta, BlockStart, MessageHead, MessagesStreamEvent, Usage};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    ToolUse,
}

#[derive(Clone, Debug)]
pub struct MessagesChunkGenerator {
    id: String,
    model: String,
    thinking: bool,
    signature: String,
    blocks: usize,
    open: Option<(usize, Open)>,
    pinged: bool,
    calls: usize,
    reasoning_seen: bool,
}

impl MessagesChunkGenerator {
    pub fn new(id: String, model: String, thinking_mode: bool) -> Self {
        MessagesChunkGenerator {
            signature: id.clone(),
            id,
            model,
            thinking: thinking_mode,
            blocks: 0,
            open: None,
            pinged: false,
            calls: 0,
            reasoning_seen: false,
        }
    }

    /// The generator for a converted Messages request.
    pub fn for_request(request: &ConversationRequest, id: String, model: String) -> Self {
        Self::new(id, model, request.conversation.thinking_mode)
    }

    /// Thinking blocks end with `signature` instead of the response id.
    pub fn with_signature(mut self, signature: String) -> Self {
        self.signature = signature;
        self
    }

    fn open_block(
        &mut self,
        block: BlockStart,
        kind: Open,
        out: &mut Vec<MessagesStreamEvent>,
    ) -> usize {
        self.close(out);
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((index, kind));
        out.push(MessagesStreamEvent::ContentBlockStart { index, block });
        if !self.pinged {
            self.pinged = true;
            out.push(MessagesStreamEvent::Ping);
        }
        index
    }

    fn close(&mut self, out: &mut Vec<MessagesStreamEvent>) {
        if let Some((index, kind)) = self.open.take() {
            if kind == Open::Thinking {
                out.push(MessagesStreamEvent::ContentBlockDelta {
                    index,
                    delta: BlockDelta::Signature(self.signature.clone()),
                });
            }
            out.push(MessagesStreamEvent::ContentBlockStop { index });
        }
    }

    fn current(&mut self, kind: Open, out: &mut Vec<MessagesStreamEvent>) -> usize {
        match self.open {
            Some((index, k)) if k == kind => index,
            _ => {
                let block = match kind {
                    Open::Thinking => BlockStart::Thinking,
                    _ => BlockStart::Text,
                };
                self.open_block(block, kind, out)
            }
        }
    }
}

impl ChunkGenerator for MessagesChunkGenerator {
    type Event = MessagesStreamEvent;

    fn start(&mut self, info: &StartInfo, out: &mut Vec<MessagesStreamEvent>) {
        let head = Arc::new(MessageHead {
            id: self.id.clone(),
            model: self.model.clone(),
        });
        let usage = Usage {
            prompt_tokens: info.prompt_tokens,
            cached_tokens: info.cached_tokens,
            completion_tokens: 0,
            reasoning_tokens: None,
        };
        out.push(MessagesStreamEvent::MessageStart { head, usage });
        if self.thinking {
            self.open_block(BlockStart::Thinking, Open::Thinking, out);
        }
    }

    fn reasoning(
        &mut self,
        text: String,
        _logprobs: Option<Vec<TokenLogprobs>>,
        out: &mut Vec<MessagesStreamEvent>,
    ) {
        self.reasoning_seen |= !text.is_empty();
        let index = self.current(Open::Thinking, out);
        out.push(MessagesStreamEvent::ContentBlockDelta {
            index,
            delta: BlockDelta::Thinking(text),
        });
    }

    fn content(
        &mut self,
        text: String,
        _logprobs: Option<Vec<TokenLogprobs>>,
        out: &mut Vec<MessagesStreamEvent>,
    ) {
        let index = self.current(Open::Text, out);
        out.push(MessagesStreamEvent::ContentBlockDelta {
            index,
            delta: BlockDelta::Text(text),
        });
    }

    fn tool_start(&mut self, name: String, out: &mut Vec<MessagesStreamEvent>) {
        let id = ids::call_id(self.calls, self.thinking && !self.reasoning_seen);
        self.calls += 1;
        self.open_block(BlockStart::ToolUse { id, name }, Open::ToolUse, out);
    }

    fn tool_args(&mut self, args: &[Arg], out: &mut Vec<MessagesStreamEvent>) {
        let Some((index, Open::ToolUse)) = self.open else {
            return;
        };
        let mut text = String::new();
        render_args(args, &mut text);
        if !text.is_empty() {
            out.push(MessagesStreamEvent::ContentBlockDelta {
                index,
                delta: BlockDelta::InputJson(text),
            });
        }
    }

    fn finish(&mut self, ending: Ending<'_>, usage: Usage, out: &mut Vec<MessagesStreamEvent>) {
        self.close(out);
        let (stop_reason, stop_sequence) = match ending {
            Ending::Stop if self.calls > 0 => ("tool_use", None),
            Ending::Stop => ("end_turn", None),
            Ending::Length => ("max_tokens", None),
            Ending::ContentFilter => ("refusal", None),
            Ending::StopSequence(s) => ("stop_sequence", Some(s.to_string())),
        };
        let usage = Usage {
            reasoning_tokens: None,
            ..usage
        };
        out.push(MessagesStreamEvent::MessageDelta {
            stop_reason,
            stop_sequence,
            usage,
        });
        out.push(MessagesStreamEvent::MessageStop);
    }
}
