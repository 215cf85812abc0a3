//! Image errors. Most variants share the official's one user-facing sentence, prefixed with the
//! image's location (`messages.0.content[1].image[0]: ...`); `kind` names the variant as the
//! official's Python `ImageError.kind` does.

use thiserror::Error;

/// The sentence the official reports for every image it cannot take.
pub const UNSUPPORTED: &str = "You have uploaded an unsupported image. Please make sure your image \
                               is valid and has one of the following formats: webp, png, jpeg, and gif.";

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ImageError {
    #[error("{0}: {UNSUPPORTED}")]
    Unsupported(String),
    #[error("{0}: {UNSUPPORTED}")]
    EmptyImage(String),
    #[error("{0}: {UNSUPPORTED}")]
    UnsupportedMediaType(String),
    #[error("{0}: {UNSUPPORTED}")]
    InvalidDataUrl(String),
    #[error("{0}: {UNSUPPORTED}")]
    ImageDimensionsTooLarge(String),
    #[error("{0}: {UNSUPPORTED}")]
    Decode(String),
    #[error("{0}: {UNSUPPORTED}")]
    Resize(String),
    #[error("{0}: {UNSUPPORTED}")]
    Encode(String),
    #[error("invalid url: {0:?}")]
    InvalidUrl(String),
    #[error("external link length {len} too long, max link length {max}")]
    UrlTooLong { len: usize, max: usize },
    #[error("Too many images: max {max} images per request, got {got}")]
    TooManyImages { max: usize, got: usize },
    #[error("{location}: image file size exceeds limit {max_mb} MB")]
    ImageTooLarge { location: String, max_mb: usize },
    #[error("Total image size exceeds the limit: max {max_mb} MB per request, got {got_mb} MB")]
    TotalSizeTooLarge { max_mb: usize, got_mb: usize },
    #[error("{location}: Failed to download image from {url}")]
    Fetch { location: String, url: String },
    #[error("{location}: Failed to download image from {url}")]
    FetchStatus {
        location: String,
        url: String,
        status: u16,
    },
    #[error("{location}: Failed to download image from {url}")]
    DestinationRejected { location: String, url: String },
    #[error("failed to build the HTTP client: {0}")]
    Client(String),
    #[error("{0}")]
    TokenBudget(String),
}

impl ImageError {
    /// The official's variant name (`ImageError.kind` in Python).
    pub fn kind(&self) -> &'static str {
        match self {
            ImageError::Unsupported(_) => "Unsupported",
            ImageError::EmptyImage(_) => "EmptyImage",
            ImageError::UnsupportedMediaType(_) => "UnsupportedMediaType",
            ImageError::InvalidDataUrl(_) => "InvalidDataUrl",
            ImageError::ImageDimensionsTooLarge(_) => "ImageDimensionsTooLarge",
            ImageError::Decode(_) => "Decode",
            ImageError::Resize(_) => "Resize",
            ImageError::Encode(_) => "Encode",
            ImageError::InvalidUrl(_) => "InvalidUrl",
            ImageError::UrlTooLong { .. } => "UrlTooLong",
            ImageError::TooManyImages { .. } => "TooManyImages",
            ImageError::ImageTooLarge { .. } => "ImageTooLarge",
            ImageError::TotalSizeTooLarge { .. } => "TotalSizeTooLarge",
            ImageError::Fetch { .. } => "Fetch",
            ImageError::FetchStatus { .. } => "FetchStatus",
            ImageError::DestinationRejected { .. } => "DestinationRejected",
            ImageError::Client(_) => "Client",
            ImageError::TokenBudget(_) => "TokenBudget",
        }
    }

    /// Whether retrying the same request may succeed: network failures and 5xx answers (the
    /// official does not count 429 as retryable, and neither do we).
    pub fn is_retryable(&self) -> bool {
        match self {
            ImageError::Fetch { .. } => true,
            ImageError::FetchStatus { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

/// The fit of an image's size to the token budget did not converge (the official's
/// `CalcResizeError`, a `ValueError` in Python).
#[derive(Debug, Error, Clone, PartialEq)]
#[error("failed to fit a {width}x{height} image to the image token budget")]
pub struct CalcResizeError {
    pub width: u32,
    pub height: u32,
}
