//! Images for DeepSeek V4.1 requests, as the official `deepseek-recipe` 0.2.0 handles them.
//!
//! Pipeline per image: bytes (data URL, raw, or fetched) -> [`codec::decode`] to RGB ->
//! [`fit::canvas`] (the patch grid the vision tower sees, and so the image's token count) ->
//! resample into the canvas, centred on grey padding ([`preprocess`]) -> lossy WebP
//! ([`webp::encode_rgb`]). [`resolve`] runs it over a request's sources under one [`ImageQuota`].
//!
//! The canvas and token arithmetic must match the official exactly (prompt lengths depend on it);
//! pixels may differ from OpenCV's resampling within the bound recipe/DEVIATIONS.md states.

pub mod codec;
pub mod error;
pub mod fetch;
pub mod fit;
pub mod preprocess;
pub mod resolve;
pub mod webp;

pub use error::{CalcResizeError, ImageError};
pub use fetch::{DestinationFilter, Fetcher};
pub use fit::{image_tokens, token_adjustment, Canvas};
pub use preprocess::{preprocess, ImageInfo, PreprocessOptions};
pub use resolve::{resolve, ImageQuota};
