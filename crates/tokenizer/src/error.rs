use thiserror::Error;

/// Everything that can go wrong while loading a tokenizer or encoding with it.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("failed to load tokenizer: {0}")]
    Load(String),
    #[error("failed to read tokenizer file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("special token \"{0}\" is not in the added vocabulary")]
    MissingSpecialToken(String),
    #[error("special range {start}..{end} is not on character boundaries of the prompt")]
    BadRange { start: usize, end: usize },
    #[error("tokenization failed: {0}")]
    Encode(String),
}

pub type Result<T> = std::result::Result<T, TokenizerError>;
