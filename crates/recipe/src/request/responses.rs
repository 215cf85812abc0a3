//! OpenAI Responses requests.
