//! DeepSeek V4 / V4.1 protocol layer: requests -> conversation -> prompt, model output -> events.

pub mod conversation;
pub mod error;
pub mod pyjson;
pub mod render;
pub mod request;
pub mod response;
pub mod special;
pub mod stream;

pub use conversation::{
    Conversation, ImageData, ImageDetail, ImageSource, Message, ReasoningEffort, ResponseFormat,
    Role, ToolCall, ToolChoice, ToolDefinition,
};
pub use error::{ConversionError, RecipeError};
pub use render::{Encoding, ModelVersion, RenderedPrompt};
pub use special::{SpecialToken, SpecialTokens};
