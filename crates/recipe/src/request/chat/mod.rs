//! OpenAI Chat Completions requests: the serde wire types (`wire`, re-exported here), the
//! one-pass reader of a request body into them (`fast_read`), and the conversion into a
//! [`ConversationRequest`](super::ConversationRequest) (`convert`, with `turns` for the messages).

mod convert;
mod fast_read;
mod turns;
mod wire;

pub use wire::*;

pub(crate) use turns::UNSUPPORTED_IMAGE_TEXT;
