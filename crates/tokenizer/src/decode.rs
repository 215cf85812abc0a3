//! Incremental decoding of streamed token ids into text.
//!
//! - The bytes of ordinary tokens accumulate; after each push, everything up to an incomplete
//!   UTF-8 sequence at the very end is emitted, and that tail (at most 3 bytes) waits for the next
//!   push. Invalid bytes become U+FFFD exactly as `String::from_utf8_lossy` replaces them, so a
//!   broken sequence followed by a complete token gives `"�more"` as deepseek-recipe does.
//! - An added token (`<｜end▁of▁sentence｜>`, `<think>`, ...) first flushes what is pending, an
//!   incomplete tail included (as U+FFFD), then is emitted as a piece of its own.
//! - Ids outside the vocabulary produce no text but count as tokens.
//! - A tail still pending at the end of the stream is dropped, and so are the tokens it holds.
//!
//! Because only a genuinely incomplete tail is held, the decoded text and token count do not
//! depend on how the ids are split into pushes (deepseek-recipe holds a whole push whose text ends
//! in U+FFFD, which makes its result depend on chunking; see recipe/DEVIATIONS.md).

use std::collections::VecDeque;

use crate::Tokenizer;

/// One decoded piece of text and the number of token ids it accounts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub text: String,
    pub tokens: usize,
}

#[derive(Debug, Default, Clone)]
pub struct IncrementalDecoder {
    /// Bytes not yet emitted: after a push, only an incomplete UTF-8 tail.
    pending: Vec<u8>,
    /// For each token not yet accounted for, the end offset of its bytes in `pending`.
    token_ends: VecDeque<usize>,
}

impl IncrementalDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decode one push of token ids, appending the pieces that became ready to `out`.
    pub fn push(&mut self, tokenizer: &Tokenizer, ids: &[u32], out: &mut Vec<Piece>) {
        for &id in ids {
            if tokenizer.is_added(id) {
                self.flush(out);
                let text = tokenizer
                    .token_bytes(id)
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                out.push(Piece { text, tokens: 1 });
            } else {
                if let Some(b) = tokenizer.token_bytes(id) {
                    self.pending.extend_from_slice(b);
                }
                self.token_ends.push_back(self.pending.len());
            }
        }
        self.emit_complete(out);
    }

    /// Number of tokens whose text is still held back.
    pub fn pending_tokens(&self) -> usize {
        self.token_ends.len()
    }

    /// End of stream: drop the incomplete tail, returning how many tokens it held.
    pub fn finish(&mut self) -> usize {
        let dropped = self.token_ends.len();
        self.pending.clear();
        self.token_ends.clear();
        dropped
    }

    /// Emit everything before an incomplete trailing sequence.
    fn emit_complete(&mut self, out: &mut Vec<Piece>) {
        if self.token_ends.is_empty() {
            return;
        }
        let (text, consumed) = decode_lossy_prefix(&self.pending);
        // Tokens whose bytes end within the emitted prefix are accounted for by this piece.
        let mut tokens = 0;
        while self.token_ends.front().is_some_and(|&end| end <= consumed) {
            self.token_ends.pop_front();
            tokens += 1;
        }
        if tokens == 0 && text.is_empty() {
            return;
        }
        self.pending.drain(..consumed);
        for end in self.token_ends.iter_mut() {
            *end -= consumed;
        }
        out.push(Piece { text, tokens });
    }

    fn flush(&mut self, out: &mut Vec<Piece>) {
        if !self.token_ends.is_empty() {
            let text = String::from_utf8_lossy(&self.pending).into_owned();
            let tokens = self.token_ends.len();
            self.pending.clear();
            self.token_ends.clear();
            out.push(Piece { text, tokens });
        }
    }
}

/// Lossy-decode `bytes` up to an incomplete sequence at the very end; returns the text and the
/// number of bytes it covers.
fn decode_lossy_prefix(bytes: &[u8]) -> (String, usize) {
    let mut text = String::with_capacity(bytes.len());
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                text.push_str(s);
                return (text, bytes.len());
            }
            Err(e) => {
                let (valid, after) = rest.split_at(e.valid_up_to());
                // SAFETY-free: `valid` was just validated.
                text.push_str(std::str::from_utf8(valid).unwrap_or_default());
                match e.error_len() {
                    Some(n) => {
                        text.push('\u{FFFD}');
                        rest = &after[n..];
                    }
                    None => return (text, bytes.len() - after.len()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::decode_lossy_prefix;

    #[test]
    fn lossy_prefix_holds_only_an_incomplete_tail() {
        assert_eq!(decode_lossy_prefix(b"ab\xF0\x9F"), ("ab".into(), 2));
        assert_eq!(
            decode_lossy_prefix(b"\xF0\x9Fmore"),
            ("\u{FFFD}more".into(), 6)
        );
        assert_eq!(decode_lossy_prefix(b"\x80"), ("\u{FFFD}".into(), 1));
        assert_eq!(decode_lossy_prefix(b"\xF0\x9F\x98\x80"), ("😀".into(), 4));
    }
}
