//! Sampling parameters: the ranges a request may ask for, and what the model version samples with.

use super::{bad, Result};
use crate::render::ModelVersion;

/// `temperature` in [0, 2] and `top_p` in (0, 1], then the values the model version samples with.
pub(crate) fn check_temperature(t: Option<f32>) -> Result<()> {
    match t {
        Some(t) if !(0.0..=2.0).contains(&t) => Err(bad(
            "Invalid temperature value, the valid range of temperature is [0, 2]",
        )),
        _ => Ok(()),
    }
}

pub(crate) fn check_top_p(p: Option<f32>) -> Result<()> {
    match p {
        Some(p) if !(p > 0.0 && p <= 1.0) => Err(bad(
            "Invalid top_p value, the valid range of top_p is (0, 1.0]",
        )),
        _ => Ok(()),
    }
}

/// The sampling values the model version uses. V4-Pro in thinking mode samples at top_p 0.95
/// when tools are declared and 1.0 otherwise, whatever the request says.
pub(crate) fn sampling(
    version: ModelVersion,
    thinking: bool,
    has_tools: bool,
    temperature: Option<f32>,
    top_p: Option<f32>,
) -> (f32, f32) {
    let temperature = if thinking {
        1.0
    } else {
        temperature.unwrap_or(1.0)
    };
    let top_p = match (version, thinking) {
        (ModelVersion::DeepseekV4Pro, true) if has_tools => 0.95,
        (ModelVersion::DeepseekV4Pro, true) => 1.0,
        (ModelVersion::DeepseekV4Pro, false) => top_p.unwrap_or(1.0),
        (ModelVersion::DeepseekV41Flash, true) => top_p.map_or(1.0, |p| p.max(0.95)),
        (ModelVersion::DeepseekV41Flash, false) => 1.0,
    };
    (temperature, top_p)
}
