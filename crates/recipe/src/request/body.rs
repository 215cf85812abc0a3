//! Request bodies: JSON text (str / bytes) or an already-built JSON value (from a Python dict).

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::RecipeError;

pub enum RequestBody<'a> {
    Text(&'a [u8]),
    Value(Value),
}

/// Parse a body into a protocol request type. JSON syntax errors read `invalid JSON request: ...`
/// (with the position); shape errors `invalid request body: ...` (without, as the body is read
/// through a JSON value first, as deepseek-recipe does).
pub fn parse_body<T: DeserializeOwned>(body: RequestBody<'_>) -> Result<T, RecipeError> {
    serde_json::from_value(to_value(body)?)
        .map_err(|e| RecipeError::InvalidBody(format!("invalid request body: {e}")))
}

/// The body as a JSON value (text is parsed; syntax errors read `invalid JSON request: ...`).
pub(crate) fn to_value(body: RequestBody<'_>) -> Result<Value, RecipeError> {
    match body {
        RequestBody::Text(bytes) => serde_json::from_slice::<Value>(bytes)
            .map_err(|e| RecipeError::InvalidBody(format!("invalid JSON request: {e}"))),
        RequestBody::Value(v) => Ok(v),
    }
}
