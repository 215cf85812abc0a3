//! Token input: ids -> output bytes for the parser, plus the bookkeeping that ties text back to
//! tokens (completion token counts, log probabilities).
//!
//! Decoding is [`deepring_tokenizer::IncrementalDecoder`]'s: only a genuinely incomplete UTF-8
//! tail waits for the next push, so the text does not depend on how ids are grouped into pushes
//! (deepseek-recipe holds the whole push instead: recipe/DEVIATIONS.md). The two special tokens
//! the parser reacts to (`</think>`, `｜DSML｜` as spelled by the parsing options) become the
//! stand-in bytes of [`super::markers`].

use std::collections::VecDeque;

use deepring_tokenizer::{IncrementalDecoder, Piece, Tokenizer};

use super::markers::{Spellings, DSML_BYTE, THINK_END_BYTE};

/// One log probability entry of the protocol output (`token`, `logprob`, `bytes`).
#[derive(Clone, Debug, PartialEq)]
pub struct LogprobEntry {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
}

/// A generated token's entry with its alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub entry: LogprobEntry,
    pub top_logprobs: Vec<LogprobEntry>,
}

pub(crate) struct TokenInput {
    decoder: IncrementalDecoder,
    think_id: Option<u32>,
    dsml_id: Option<u32>,
    pieces: Vec<Piece>,
    /// Log probabilities of tokens the decoder still holds, in order.
    waiting: VecDeque<Option<TokenLogprobs>>,
}

/// Output of one push: bytes for the parser, and for each decoded token its output byte range
/// (relative to the start of `bytes`) with its log probabilities.
#[derive(Default)]
pub(crate) struct Decoded {
    pub bytes: Vec<u8>,
    /// Decoder pieces: (end of its bytes, tokens it accounts for). A special token is a piece of
    /// its own, so a push splits into pieces at special tokens.
    pub pieces: Vec<(usize, usize)>,
    pub ranged: Vec<(usize, usize, Option<TokenLogprobs>)>,
}

impl TokenInput {
    pub fn new(tokenizer: &Tokenizer, think_end: &str, dsml: &str) -> Self {
        TokenInput {
            decoder: IncrementalDecoder::new(),
            think_id: tokenizer.added_token_id(think_end),
            dsml_id: tokenizer.added_token_id(dsml),
            pieces: Vec::new(),
            waiting: VecDeque::new(),
        }
    }

    /// How the two markers look in decoded token input.
    pub fn spellings(&self) -> Spellings {
        Spellings {
            think_end: self.think_id.map(|_| vec![THINK_END_BYTE]),
            dsml: self.dsml_id.map(|_| vec![DSML_BYTE]),
        }
    }

    /// Decode one push. `logprobs`, when given, has one entry per id (checked by the caller).
    pub fn push(
        &mut self,
        tokenizer: &Tokenizer,
        ids: &[u32],
        logprobs: Option<Vec<TokenLogprobs>>,
        out: &mut Decoded,
    ) {
        match logprobs {
            Some(lps) => self.waiting.extend(lps.into_iter().map(Some)),
            None => self.waiting.extend(ids.iter().map(|_| None)),
        }
        let mut start = 0;
        for (i, &id) in ids.iter().enumerate() {
            let marker = if Some(id) == self.think_id {
                THINK_END_BYTE
            } else if Some(id) == self.dsml_id {
                DSML_BYTE
            } else {
                continue;
            };
            self.decode(tokenizer, &ids[start..i], out);
            // An added token: the decoder flushes what it holds, then gives the token its own
            // piece, which the parser sees as the stand-in byte.
            self.decoder.push(tokenizer, &[id], &mut self.pieces);
            if let Some(last) = self.pieces.last_mut() {
                last.text.clear();
            }
            let n = self.pieces.len();
            for (k, piece) in self.pieces.drain(..).enumerate() {
                let begin = out.bytes.len();
                if k + 1 == n {
                    out.bytes.push(marker);
                } else {
                    out.bytes.extend_from_slice(piece.text.as_bytes());
                }
                Self::account(&mut self.waiting, begin, out.bytes.len(), piece.tokens, out);
            }
            start = i + 1;
        }
        self.decode(tokenizer, &ids[start..], out);
    }

    fn decode(&mut self, tokenizer: &Tokenizer, ids: &[u32], out: &mut Decoded) {
        if ids.is_empty() {
            return;
        }
        self.decoder.push(tokenizer, ids, &mut self.pieces);
        for piece in self.pieces.drain(..) {
            let begin = out.bytes.len();
            out.bytes.extend_from_slice(piece.text.as_bytes());
            Self::account(&mut self.waiting, begin, out.bytes.len(), piece.tokens, out);
        }
    }

    fn account(
        waiting: &mut VecDeque<Option<TokenLogprobs>>,
        begin: usize,
        end: usize,
        tokens: usize,
        out: &mut Decoded,
    ) {
        out.pieces.push((end, tokens));
        for _ in 0..tokens {
            let lp = waiting.pop_front().flatten();
            out.ranged.push((begin, end, lp));
        }
    }

    /// End of output: the held tail is dropped; returns how many tokens it held.
    pub fn finish(&mut self) -> usize {
        self.waiting.clear();
        self.decoder.finish()
    }
}

/// The `token` / `bytes` of one id, as the protocol log probabilities report them: the token's
/// text, or when its bytes are not UTF-8 on their own (part of a character) every byte as
/// `\xNN`, as deepseek-recipe writes it. An unknown id has no text and no bytes.
pub(crate) fn logprob_entry(tokenizer: &Tokenizer, id: u32, logprob: f64) -> LogprobEntry {
    let bytes = tokenizer
        .token_bytes(id)
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    let token = match std::str::from_utf8(&bytes) {
        Ok(s) => s.to_string(),
        Err(_) => {
            use std::fmt::Write;
            let mut s = String::with_capacity(bytes.len() * 4);
            for b in &bytes {
                let _ = write!(s, "\\x{b:02x}");
            }
            s
        }
    };
    LogprobEntry {
        token,
        logprob,
        bytes,
    }
}
