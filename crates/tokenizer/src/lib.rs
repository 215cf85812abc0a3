//! Prompt encoding for DeepSeek V4 / V4.1.
//!
//! A rendered prompt is plain text plus a list of *special ranges*: byte spans that each stand for
//! one special token. Encoding emits the token's id for each range and encodes every plain segment
//! between ranges with the BPE model alone (no added-vocabulary matching, no BOS), exactly as
//! deepseek-recipe does. Segments are independent, so they are encoded in parallel; see
//! [`parallel`] for how a single long segment is split as well.

mod bytelevel;
mod charclass;
mod decode;
mod error;
mod parallel;
mod pretokenize;
pub mod pretrained;
mod tokenizer;

pub use decode::{IncrementalDecoder, Piece};
pub use error::TokenizerError;
pub use parallel::{set_default_threads, Parallelism, Tuning};
pub use tokenizer::{PendingCount, Tokenizer};
