//! A Hugging Face `tokenizer.json` loaded for prompt encoding and streaming decode.

use std::collections::HashMap;
use std::sync::Arc;

use tokenizers::{
    Model, NormalizedString, Normalizer, OffsetReferential, OffsetType, PreTokenizedString,
    PreTokenizer,
};

use crate::bytelevel;
use crate::error::{Result, TokenizerError};
use crate::parallel::{self, Parallelism, Tuning};
use crate::pretokenize;

struct Inner {
    hf: tokenizers::Tokenizer,
    /// Added-vocabulary spelling -> id: what a special range of a prompt is looked up in.
    added: HashMap<String, u32>,
    /// id -> the bytes it decodes to; `None` for ids outside the vocabulary.
    bytes: Vec<Option<Box<[u8]>>>,
    /// id -> whether it is an added token (decoded as its own piece of text).
    is_added: Vec<bool>,
    /// The first characters of the added-vocabulary spellings: text that contains none of them
    /// cannot contain an added token.
    added_first: Vec<char>,
    /// Byte -> byte-level character, when the pre-tokenizer is DeepSeek's and plain text takes
    /// the hand-written path ([`crate::pretokenize`]); `None` for any other tokenizer.
    fast_bytes: Option<[char; 256]>,
}

/// A token count computing on another thread ([`Tokenizer::count_tokens_in_background`]).
/// (The receiver sits in a mutex so that holders stay `Sync`, as Python objects must be.)
pub struct PendingCount(std::sync::Mutex<std::sync::mpsc::Receiver<usize>>);

impl PendingCount {
    /// Wait for the count.
    pub fn wait(self) -> usize {
        match self.0.into_inner() {
            Ok(rx) => rx.recv().unwrap_or(0),
            Err(poisoned) => poisoned.into_inner().recv().unwrap_or(0),
        }
    }
}

/// A loaded tokenizer. Cloning is cheap (the vocabulary is shared).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
    parallelism: Parallelism,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.inner.bytes.len())
            .field("added", &self.inner.added.len())
            .field("parallelism", &self.parallelism)
            .finish()
    }
}

impl Tokenizer {
    /// Load from the contents of a `tokenizer.json`.
    pub fn from_json(json: &str) -> Result<Self> {
        let hf: tokenizers::Tokenizer = json
            .parse()
            .map_err(|e: tokenizers::Error| TokenizerError::Load(e.to_string()))?;
        Ok(Self::from_hf(hf))
    }

    /// Load from a `tokenizer.json` file.
    pub fn from_file(path: &str) -> Result<Self> {
        let json = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
            path: path.to_string(),
            source,
        })?;
        Self::from_json(&json)
    }

    fn from_hf(hf: tokenizers::Tokenizer) -> Self {
        let added: HashMap<String, u32> = hf
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, tok)| (tok.content, id))
            .collect();
        let size = hf.get_vocab_size(true) as u32;
        let max_id = added
            .values()
            .copied()
            .max()
            .map_or(size, |m| m.max(size - 1) + 1);
        let map = bytelevel::char_to_byte();
        let mut bytes = Vec::with_capacity(max_id as usize);
        let mut is_added = vec![false; max_id as usize];
        for id in 0..max_id {
            bytes.push(
                hf.id_to_token(id)
                    .map(|t| bytelevel::token_bytes(&t, &map).into_boxed_slice()),
            );
        }
        for &id in added.values() {
            is_added[id as usize] = true;
            // Added tokens decode to their own spelling, byte-level alphabet or not.
            if let Some(t) = hf.id_to_token(id) {
                bytes[id as usize] = Some(t.into_bytes().into_boxed_slice());
            }
        }
        let mut added_first: Vec<char> = added.keys().filter_map(|s| s.chars().next()).collect();
        added_first.sort_unstable();
        added_first.dedup();
        let fast = pretokenize::is_deepseek(
            serde_json::to_value(hf.get_normalizer()).ok(),
            serde_json::to_value(hf.get_pre_tokenizer()).ok(),
        );
        Tokenizer {
            inner: Arc::new(Inner {
                hf,
                added,
                bytes,
                is_added,
                added_first,
                fast_bytes: fast.then(bytelevel::byte_to_char),
            }),
            parallelism: Parallelism::Auto,
        }
    }

    /// The same tokenizer with another thread policy for prompt encoding.
    pub fn with_parallelism(&self, parallelism: Parallelism) -> Self {
        Tokenizer {
            inner: Arc::clone(&self.inner),
            parallelism,
        }
    }

    pub fn parallelism(&self) -> Parallelism {
        self.parallelism
    }

    /// Encode `text` with the full vocabulary: spellings of added tokens become their ids.
    /// No special tokens are added around the text.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .hf
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The number of ids [`Tokenizer::encode`] gives for `text`. Text that cannot hold an
    /// added-vocabulary spelling takes the plain path, which gives the same ids and runs in
    /// parallel for long text (the stream processor counts reasoning tokens with it).
    pub fn count_tokens(&self, text: &str) -> Result<usize> {
        if self.inner.added_first.iter().any(|&c| text.contains(c)) {
            return Ok(self.encode(text)?.len());
        }
        Ok(self.encode_prompt(text, &[])?.len())
    }

    /// [`Tokenizer::count_tokens`] on a pool thread: the stream processor counts settled
    /// reasoning text while output keeps arriving.
    pub fn count_tokens_in_background(&self, text: String) -> PendingCount {
        let (tx, rx) = std::sync::mpsc::channel();
        let tokenizer = self.with_parallelism(Parallelism::Threads(1));
        parallel::spawn(self.parallelism.threads(), move || {
            let _ = tx.send(tokenizer.count_tokens(&text).unwrap_or(0));
        });
        PendingCount(std::sync::Mutex::new(rx))
    }

    /// The first position at or after `from` where `text` can be cut so that counting (or
    /// encoding) the two parts gives the same as the whole (`None`: no such position).
    pub fn safe_cut(text: &str, from: usize) -> Option<usize> {
        parallel::cut_at_or_after(text, from)
    }

    /// Encode plain text with the BPE model only: no added-vocabulary matching, no BOS.
    /// Sequential; see [`Tokenizer::encode_prompt`] for the parallel path.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_plain_into(text, &mut out)?;
        Ok(out)
    }

    fn encode_plain_into(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let hf = &self.inner.hf;
        let err = |e: tokenizers::Error| TokenizerError::Encode(e.to_string());
        if let Some(table) = &self.inner.fast_bytes {
            let model = hf.get_model();
            let mut mapped = String::new();
            let mut failure = None;
            pretokenize::for_each_piece(text, |piece| {
                if failure.is_some() {
                    return;
                }
                mapped.clear();
                mapped.extend(piece.bytes().map(|b| table[b as usize]));
                match model.tokenize(&mapped) {
                    Ok(tokens) => out.extend(tokens.iter().map(|t| t.id)),
                    Err(e) => failure = Some(e),
                }
            });
            return failure.map_or(Ok(()), |e| Err(err(e)));
        }
        let mut normalized = NormalizedString::from(text);
        if let Some(n) = hf.get_normalizer() {
            n.normalize(&mut normalized).map_err(err)?;
        }
        let mut pre = PreTokenizedString::from(normalized);
        if let Some(p) = hf.get_pre_tokenizer() {
            p.pre_tokenize(&mut pre).map_err(err)?;
        }
        let model = hf.get_model();
        pre.tokenize(|n| model.tokenize(n.get())).map_err(err)?;
        for (_, _, tokens) in pre.get_splits(OffsetReferential::Original, OffsetType::None) {
            if let Some(tokens) = tokens {
                out.extend(tokens.iter().map(|t| t.id));
            }
        }
        Ok(())
    }

    /// Encode a rendered prompt: each `special_ranges` span (byte offsets, ascending, disjoint) is
    /// one added token; the text between spans is encoded with [`Tokenizer::encode_plain`].
    /// Plain text is encoded in parallel (see [`crate::parallel`]); the result equals sequential
    /// encoding.
    pub fn encode_prompt(
        &self,
        prompt: &str,
        special_ranges: &[(usize, usize)],
    ) -> Result<Vec<u32>> {
        self.encode_prompt_tuned(prompt, special_ranges, Tuning::default())
    }

    /// [`Tokenizer::encode_prompt`] with explicit size thresholds (tests force fine cuts with it).
    pub fn encode_prompt_tuned(
        &self,
        prompt: &str,
        special_ranges: &[(usize, usize)],
        tuning: Tuning,
    ) -> Result<Vec<u32>> {
        enum Item {
            Special(u32),
            Plain(usize),
        }
        let threads = self.parallelism.threads();
        let special_bytes: usize = special_ranges
            .iter()
            .map(|(s, e)| e.saturating_sub(*s))
            .sum();
        // Saturating: ranges are validated below, a bad one must become an error, not a panic.
        let plain_total = prompt.len().saturating_sub(special_bytes);
        let target = plain_total / (threads * tuning.pieces_per_thread).max(1);
        let min_piece = tuning.min_piece_bytes;
        let mut items: Vec<Item> = Vec::with_capacity(special_ranges.len() * 2 + 1);
        let mut pieces: Vec<&str> = Vec::new();
        fn push_plain<'a>(
            text: &'a str,
            (target, min_piece): (usize, usize),
            items: &mut Vec<Item>,
            pieces: &mut Vec<&'a str>,
        ) {
            for piece in parallel::split_points(text, target, min_piece) {
                items.push(Item::Plain(pieces.len()));
                pieces.push(piece);
            }
        }
        let mut cursor = 0;
        for &(start, end) in special_ranges {
            if start < cursor
                || end <= start
                || end > prompt.len()
                || !prompt.is_char_boundary(start)
                || !prompt.is_char_boundary(end)
            {
                return Err(TokenizerError::BadRange { start, end });
            }
            if start > cursor {
                push_plain(
                    &prompt[cursor..start],
                    (target, min_piece),
                    &mut items,
                    &mut pieces,
                );
            }
            let spelling = &prompt[start..end];
            let id = self
                .inner
                .added
                .get(spelling)
                .copied()
                .ok_or_else(|| TokenizerError::MissingSpecialToken(spelling.to_string()))?;
            items.push(Item::Special(id));
            cursor = end;
        }
        if cursor < prompt.len() {
            push_plain(
                &prompt[cursor..],
                (target, min_piece),
                &mut items,
                &mut pieces,
            );
        }
        let encoded: Vec<Result<Vec<u32>>> =
            parallel::map_pieces(threads, plain_total, tuning, &pieces, |p| {
                self.encode_plain(p)
            });
        let mut encoded: Vec<Vec<u32>> = encoded.into_iter().collect::<Result<_>>()?;
        let mut out =
            Vec::with_capacity(encoded.iter().map(Vec::len).sum::<usize>() + special_ranges.len());
        for item in items {
            match item {
                Item::Special(id) => out.push(id),
                Item::Plain(i) => out.append(&mut encoded[i]),
            }
        }
        Ok(out)
    }

    /// Id of an added-vocabulary spelling.
    pub fn added_token_id(&self, spelling: &str) -> Option<u32> {
        self.inner.added.get(spelling).copied()
    }

    /// Id of any spelling in the vocabulary (model or added).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.hf.token_to_id(token)
    }

    /// The bytes `id` decodes to, or `None` when `id` is not in the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.inner.bytes.get(id as usize)?.as_deref()
    }

    /// Whether `id` is an added token (decoded as a piece of its own).
    pub fn is_added(&self, id: u32) -> bool {
        self.inner
            .is_added
            .get(id as usize)
            .copied()
            .unwrap_or(false)
    }

    /// One past the largest id.
    pub fn vocab_size(&self) -> usize {
        self.inner.bytes.len()
    }

    /// Decode ids to text (added tokens included, invalid ids skipped, lossy UTF-8).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            if let Some(b) = self.token_bytes(id) {
                bytes.extend_from_slice(b);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
