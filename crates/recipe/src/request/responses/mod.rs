//! OpenAI Responses requests: the serde wire types (`wire` for the settings, tools and tool
//! choice, `wire_items` for the input items; re-exported here), the conversion into a
//! [`ConversationRequest`](super::ConversationRequest) (`convert`, with `tools` for the declared
//! tools and `turns` for the input), and what a response object echoes of the request (`echo`).

mod convert;
mod echo;
mod tools;
mod turns;
mod wire;
mod wire_items;

pub use wire::*;
pub use wire_items::*;
