//! The stream processor: backend chunks in, protocol events out.
//!
//! It owns the parser, the token decoder and one chunk generator, and keeps the usage counts:
//! - completion tokens: the `token_count` of text chunks, or the decoded token ids (a trailing
//!   incomplete UTF-8 sequence is dropped at the end and not counted);
//! - reasoning tokens, reported when a tokenizer is attached and a thinking stage is set: like
//!   deepseek-recipe, the reasoning text is encoded again and its tokens counted, so the count
//!   does not depend on how the model (or the backend's text chunks) split it;
//! - log probabilities follow the text of their token: a token's entry goes with the first
//!   emitted piece that contains any of its text, and is dropped when all of it was markup.

use std::collections::VecDeque;

use deepring_tokenizer::{PendingCount, Tokenizer};
use thiserror::Error;

use super::chunk::{InferenceChunk, InferenceFinishReason, TokenLogprob};
use super::generator::{ChunkGenerator, Ending, StartInfo};
use super::markers::Spellings;
use super::parser::{Arg, Mode, Out, Parser};
use super::tokens::{logprob_entry, Decoded, TokenInput, TokenLogprobs};
use crate::request::ParsingOptions;
use crate::response::Usage;
use crate::special::SpecialToken;

/// Misuse of a processor or a malformed chunk. Python sees each as `RuntimeError`.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum StreamError {
    #[error("stream processor has finished")]
    Finished,
    #[error("stream processor is closed")]
    Closed,
    #[error("token chunk received without a tokenizer")]
    NoTokenizer,
    #[error("invalid log probabilities: {logprobs} log probabilities for {ids} token IDs")]
    LogprobCount { logprobs: usize, ids: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Open,
    Finished,
    Closed,
}

pub struct StreamProcessor<G: ChunkGenerator> {
    generator: G,
    parser: Parser,
    tokenizer: Option<Tokenizer>,
    tokens: Option<TokenInput>,
    state: State,
    started: bool,
    ready: bool,
    info: StartInfo,
    completion_tokens: u64,
    /// Text was pushed: completion_tokens is then the caller's count, not the ids generated.
    text_input: bool,
    /// A thinking stage was set and a tokenizer attached: usage reports reasoning tokens.
    count_reasoning: bool,
    /// Settled reasoning not yet counted, and counts running on the tokenizer's pool.
    reasoning_text: String,
    reasoning_counts: Vec<PendingCount>,
    /// Log probabilities by output byte range, in order.
    logprobs: VecDeque<(usize, usize, TokenLogprobs)>,
    pieces: Vec<Out>,
    args: Vec<Arg>,
}

impl<G: ChunkGenerator> StreamProcessor<G> {
    pub fn new(generator: G, options: &ParsingOptions, tokenizer: Option<Tokenizer>) -> Self {
        let think = options.special_tokens.token(SpecialToken::ThinkingEnd);
        let dsml = options.special_tokens.token(SpecialToken::Dsml);
        let tokens = tokenizer.as_ref().map(|t| TokenInput::new(t, think, dsml));
        let spellings = tokens
            .as_ref()
            .map(TokenInput::spellings)
            .unwrap_or(Spellings {
                think_end: None,
                dsml: None,
            });
        let count_reasoning = options.thinking_initial_stage.is_some() && tokenizer.is_some();
        StreamProcessor {
            generator,
            parser: Parser::new(options, spellings),
            tokenizer,
            tokens,
            state: State::Open,
            started: false,
            ready: false,
            info: StartInfo::default(),
            completion_tokens: 0,
            text_input: false,
            count_reasoning,
            reasoning_text: String::new(),
            reasoning_counts: Vec::new(),
            logprobs: VecDeque::new(),
            pieces: Vec::new(),
            args: Vec::new(),
        }
    }

    /// Completed normally (finish chunk, stop sequence or `finish`) and not closed.
    pub fn finished(&self) -> bool {
        self.state == State::Finished
    }

    /// Release the processor without completing it.
    pub fn close(&mut self) {
        self.state = State::Closed;
        self.logprobs.clear();
        self.reasoning_text.clear();
    }

    fn check_open(&self) -> Result<(), StreamError> {
        match self.state {
            State::Open => Ok(()),
            State::Finished => Err(StreamError::Finished),
            State::Closed => Err(StreamError::Closed),
        }
    }

    /// Process one chunk. A stream error closes the processor.
    pub fn push(&mut self, chunk: &InferenceChunk) -> Result<Vec<G::Event>, StreamError> {
        self.check_open()?;
        let mut out = Vec::new();
        match chunk {
            InferenceChunk::Ready {
                prompt_usage,
                system_fingerprint,
            } => {
                if !self.ready {
                    self.ready = true;
                    let usage = prompt_usage.unwrap_or_default();
                    self.info = StartInfo {
                        prompt_tokens: usage.prompt_tokens,
                        cached_tokens: usage.prompt_cache_hit_tokens,
                        system_fingerprint: system_fingerprint.clone(),
                    };
                    self.start(&mut out);
                }
            }
            InferenceChunk::Text {
                content,
                token_count,
            } => {
                self.completion_tokens = self.completion_tokens.saturating_add(*token_count);
                self.text_input = true;
                self.start(&mut out);
                self.parser
                    .push(Mode::Text, content.as_bytes(), &mut self.pieces);
                self.dispatch(&mut out);
            }
            InferenceChunk::Tokens {
                token_ids,
                logprobs,
            } => {
                if let Err(e) = self.tokens(token_ids, logprobs.as_deref(), &mut out) {
                    self.close();
                    return Err(e);
                }
            }
            InferenceChunk::Finish(reason) => {
                self.start(&mut out);
                let ending = match reason {
                    InferenceFinishReason::Stop => Ending::Stop,
                    InferenceFinishReason::Length => Ending::Length,
                    InferenceFinishReason::ContentFilter => Ending::ContentFilter,
                };
                self.end(ending, &mut out);
            }
        }
        Ok(out)
    }

    /// End of input without a finish chunk (a `Stop`); after completion it returns nothing.
    pub fn finish(&mut self) -> Result<Vec<G::Event>, StreamError> {
        match self.state {
            State::Closed => Err(StreamError::Closed),
            State::Finished => Ok(Vec::new()),
            State::Open => {
                let mut out = Vec::new();
                self.start(&mut out);
                self.end(Ending::Stop, &mut out);
                Ok(out)
            }
        }
    }

    fn start(&mut self, out: &mut Vec<G::Event>) {
        if !self.started {
            self.started = true;
            self.generator.start(&self.info, out);
        }
    }

    fn tokens(
        &mut self,
        ids: &[u32],
        logprobs: Option<&[TokenLogprob]>,
        out: &mut Vec<G::Event>,
    ) -> Result<(), StreamError> {
        let (Some(tokenizer), Some(input)) = (self.tokenizer.as_ref(), self.tokens.as_mut()) else {
            return Err(StreamError::NoTokenizer);
        };
        if let Some(lps) = logprobs {
            if lps.len() != ids.len() {
                return Err(StreamError::LogprobCount {
                    logprobs: lps.len(),
                    ids: ids.len(),
                });
            }
        }
        let logprobs = logprobs.map(|lps| {
            ids.iter()
                .zip(lps)
                .map(|(&id, lp)| TokenLogprobs {
                    entry: logprob_entry(tokenizer, id, lp.logprob),
                    top_logprobs: lp
                        .top_logprobs
                        .iter()
                        .map(|&(t, l)| logprob_entry(tokenizer, t, l))
                        .collect(),
                })
                .collect()
        });
        let mut decoded = Decoded::default();
        input.push(tokenizer, ids, logprobs, &mut decoded);
        if decoded.bytes.is_empty() {
            // Nothing decodable yet (held UTF-8, unknown ids): like deepseek-recipe, such a push
            // produces no events, not even the first one.
            self.count(decoded.pieces.iter().map(|&(_, n)| n).sum());
            return Ok(());
        }
        self.start(out);
        let base = self.parser.offset();
        for (s, e, lp) in decoded.ranged {
            if let Some(lp) = lp {
                self.logprobs.push_back((base + s, base + e, lp));
            }
        }
        // Piece by piece, as deepseek-recipe does: when a stop sequence ends the output, the
        // tokens of the pieces after the one holding it are not counted.
        let mut from = 0;
        for &(end, tokens) in &decoded.pieces {
            self.count(tokens);
            if end > from {
                self.parser
                    .push(Mode::Tokens, &decoded.bytes[from..end], &mut self.pieces);
                from = end;
                if self.parser.stopped() {
                    break;
                }
            }
        }
        self.dispatch(out);
        Ok(())
    }

    fn count(&mut self, tokens: usize) {
        self.completion_tokens = self.completion_tokens.saturating_add(tokens as u64);
    }

    /// Log probabilities of the tokens whose text the output range `start..end` starts or holds.
    fn take_logprobs(&mut self, start: usize, end: usize) -> Option<Vec<TokenLogprobs>> {
        while self.logprobs.front().is_some_and(|&(_, e, _)| e <= start) {
            self.logprobs.pop_front();
        }
        let mut taken = Vec::new();
        while self.logprobs.front().is_some_and(|&(s, _, _)| s < end) {
            if let Some((_, _, lp)) = self.logprobs.pop_front() {
                taken.push(lp);
            }
        }
        if taken.is_empty() {
            None
        } else {
            Some(taken)
        }
    }

    /// Append to `lp` the log probabilities of the output range `start..end` (none for an empty
    /// range: JSON-mode spaces). Merged pieces each add those of their own text, so a token the
    /// parser dropped between two pieces (a stray `</think>`) is skipped, as deepseek-recipe
    /// skips it.
    fn add_logprobs(&mut self, lp: &mut Option<Vec<TokenLogprobs>>, start: usize, end: usize) {
        if start < end {
            if let Some(more) = self.take_logprobs(start, end) {
                lp.get_or_insert_with(Vec::new).extend(more);
            }
        }
    }

    /// Hand the parsed pieces to the generator, merging neighbours of one kind.
    fn dispatch(&mut self, out: &mut Vec<G::Event>) {
        let pieces = std::mem::take(&mut self.pieces);
        let mut stop = None;
        let mut iter = pieces.into_iter().peekable();
        while let Some(piece) = iter.next() {
            match piece {
                Out::Reasoning {
                    mut text,
                    start,
                    end,
                } => {
                    let mut lp = None;
                    self.add_logprobs(&mut lp, start, end);
                    while let Some(Out::Reasoning {
                        text: t,
                        start: s,
                        end: e,
                    }) = iter.peek()
                    {
                        text.push_str(t);
                        self.add_logprobs(&mut lp, *s, *e);
                        iter.next();
                    }
                    if self.count_reasoning {
                        self.reasoning_text.push_str(&text);
                        self.count_settled_reasoning();
                    }
                    self.generator.reasoning(text, lp, out);
                }
                Out::Content {
                    mut text,
                    start,
                    end,
                } => {
                    let mut lp = None;
                    self.add_logprobs(&mut lp, start, end);
                    while let Some(Out::Content {
                        text: t,
                        start: s,
                        end: e,
                    }) = iter.peek()
                    {
                        text.push_str(t);
                        self.add_logprobs(&mut lp, *s, *e);
                        iter.next();
                    }
                    self.generator.content(text, lp, out);
                }
                Out::ToolStart { name } => self.generator.tool_start(name, out),
                Out::Arg(arg) => {
                    self.args.clear();
                    self.args.push(arg);
                    while let Some(Out::Arg(_)) = iter.peek() {
                        if let Some(Out::Arg(a)) = iter.next() {
                            self.args.push(a);
                        }
                    }
                    let args = std::mem::take(&mut self.args);
                    self.generator.tool_args(&args, out);
                    self.args = args;
                }
                Out::Stop(i) => stop = Some(i),
            }
        }
        if let Some(i) = stop {
            let seq = self.parser.stop_sequence(i).to_string();
            self.end(Ending::StopSequence(&seq), out);
        }
    }

    fn end(&mut self, ending: Ending<'_>, out: &mut Vec<G::Event>) {
        self.parser.finish(&mut self.pieces);
        // The bytes of an unfinished character are dropped, but their tokens were generated and
        // count (recipe/DEVIATIONS.md 3); after a stop sequence nothing further counts.
        let held = self.tokens.as_mut().map_or(0, |t| t.finish());
        if !matches!(ending, Ending::StopSequence(_)) {
            self.count(held);
        }
        self.dispatch(out);
        let usage = self.usage();
        self.generator.finish(ending, usage, out);
        self.state = State::Finished;
        self.logprobs.clear();
    }

    /// Hand the counting of long settled reasoning to the tokenizer's pool, cut where counting the
    /// parts gives the count of the whole, so the count is ready (or nearly) at the end.
    fn count_settled_reasoning(&mut self) {
        const BATCH: usize = 4096;
        let Some(t) = &self.tokenizer else {
            return;
        };
        if self.reasoning_text.len() < 2 * BATCH {
            return;
        }
        if let Some(cut) = Tokenizer::safe_cut(&self.reasoning_text, BATCH) {
            let rest = self.reasoning_text.split_off(cut);
            let done = std::mem::replace(&mut self.reasoning_text, rest);
            self.reasoning_counts
                .push(t.count_tokens_in_background(done));
        }
    }

    fn usage(&mut self) -> Usage {
        let reasoning_tokens = match &self.tokenizer {
            Some(t) if self.count_reasoning => {
                let rest = t.count_tokens(&self.reasoning_text).unwrap_or(0);
                let done: usize = self
                    .reasoning_counts
                    .drain(..)
                    .map(PendingCount::wait)
                    .sum();
                let count = (rest + done) as u64;
                // Re-encoding the reasoning text can give more tokens than the ids generated (a
                // model's ids need not be the tokenizer's own segmentation); the reasoning is
                // part of the completion, so with token-id input, where completion_tokens
                // counts those ids, it never exceeds it (DEVIATIONS.md).
                Some(if self.text_input {
                    count
                } else {
                    count.min(self.completion_tokens)
                })
            }
            _ => None,
        };
        Usage {
            prompt_tokens: self.info.prompt_tokens,
            cached_tokens: self.info.cached_tokens,
            completion_tokens: self.completion_tokens,
            reasoning_tokens,
        }
    }
}
