//! Errors of the recipe crate. The Python binding maps each variant in one place.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum RecipeError {
    /// A protocol request that cannot be converted: an OpenAI-shaped 400 (see [`ConversionError`]).
    #[error("{0}")]
    Conversion(#[from] ConversionError),
    /// A malformed request body (bad JSON, wrong types): Python `ValueError`.
    #[error("{0}")]
    InvalidBody(String),
    /// A bad argument to a constructor: Python `ValueError`.
    #[error("{0}")]
    InvalidArgument(String),
    /// Misuse of a stateful object (consumed request, finished processor): Python `RuntimeError`.
    #[error("{0}")]
    Misuse(String),
}

/// A conversion failure with the HTTP status and the OpenAI error body deepseek-recipe returns.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{message}")]
pub struct ConversionError {
    pub status_code: u16,
    pub message: String,
}

impl ConversionError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ConversionError {
            status_code: 400,
            message: message.into(),
        }
    }

    /// `{"error":{"message":M,"type":"invalid_request_error","param":null,"code":"invalid_request_error"}}`
    pub fn body(&self) -> String {
        let mut out = String::from("{\"error\":{\"message\":");
        out.push_str(&serde_json::Value::String(self.message.clone()).to_string());
        out.push_str(
            ",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"invalid_request_error\"}}",
        );
        out
    }
}
