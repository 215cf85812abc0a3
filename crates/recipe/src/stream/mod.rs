//! Streaming output processing: backend chunks (text or token ids) -> protocol events.
//!
//! ```text
//! InferenceChunk ──▶ StreamProcessor ──tokens──▶ TokenInput (incremental UTF-8, marker ids)
//!                         │                          │ bytes
//!                         │◀────── Out pieces ─── Parser (stage machine + marker automata)
//!                         ▼
//!                   ChunkGenerator (Chat / Responses / Messages) ──▶ protocol events
//! ```
//!
//! The parser never rescans settled output: each byte is looked at once by the current stage's
//! Aho–Corasick automaton, and text is emitted as soon as no marker can still start in it.

mod automaton;
mod chat;
mod chunk;
mod generator;
mod ids;
mod markers;
mod matcher;
mod messages;
mod parser;
mod processor;
mod responses;
mod tokens;

pub use chat::ChatCompletionChunkGenerator;
pub use chunk::{InferenceChunk, InferenceFinishReason, PromptUsage, TokenLogprob};
pub use generator::{ChunkGenerator, Ending, StartInfo};
pub use messages::MessagesChunkGenerator;
pub use parser::Arg;
pub use processor::{StreamError, StreamProcessor};
pub use responses::ResponsesChunkGenerator;
pub use tokens::{LogprobEntry, TokenLogprobs};
