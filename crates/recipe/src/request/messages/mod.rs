//! Anthropic Messages requests: the serde wire types (`wire`, re-exported here) and the
//! conversion into a [`ConversationRequest`](super::ConversationRequest) (`convert`, with `turns`
//! walking the messages).

mod convert;
mod turns;
mod wire;

pub use wire::*;
