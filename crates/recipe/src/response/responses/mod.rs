//! OpenAI Responses: the response object, its output items, stream events, and accumulation.
//!
//! `echo` holds the request settings a response reports, `items` the output items, `object` the
//! response object, `events` the stream events and `accumulate` the non-streaming body.

mod accumulate;
mod echo;
mod events;
mod items;
mod object;

pub use accumulate::ResponsesResponse;
pub use echo::{ResponsesEcho, ServedSettings};
pub use events::{DeltaKind, ResponsesEventKind, ResponsesStreamEvent};
pub use items::{ItemBody, ItemStatus, OutputItem};
pub use object::{ResponseObject, ResponseStatus};
