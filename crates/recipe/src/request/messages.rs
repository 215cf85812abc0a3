//! Anthropic Messages requests.
