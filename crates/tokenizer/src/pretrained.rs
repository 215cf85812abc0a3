//! Finding a `tokenizer.json` for `Tokenizer.from_pretrained` without network access.
//!
//! The official downloads from the Hugging Face Hub. Serving machines are often offline, so this
//! takes a local directory or file, or a Hub name already in the local Hugging Face cache, and
//! otherwise says plainly that it does not download.

use std::path::{Path, PathBuf};

use crate::error::TokenizerError;

/// The `tokenizer.json` that `identifier` names: a file, a directory holding one, or a Hub model
/// id (`org/name`) at `revision` (default `main`) in the Hugging Face cache.
pub fn locate(identifier: &str, revision: Option<&str>) -> Result<PathBuf, TokenizerError> {
    let path = Path::new(identifier);
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    if path.is_dir() {
        let file = path.join("tokenizer.json");
        return if file.is_file() {
            Ok(file)
        } else {
            Err(TokenizerError::Load(format!(
                "no tokenizer.json in directory {identifier}"
            )))
        };
    }
    let cache = hub_cache();
    if let Some(file) = cache
        .as_deref()
        .and_then(|c| cached(c, identifier, revision.unwrap_or("main")))
    {
        return Ok(file);
    }
    let place = cache
        .map(|c| format!(" or in the Hugging Face cache at {}", c.display()))
        .unwrap_or_default();
    Err(TokenizerError::Load(format!(
        "{identifier:?} is not a local file or directory{place}; deepring_recipe does not download from \
         the Hugging Face Hub: download tokenizer.json and pass its path or directory"
    )))
}

/// The Hub cache directory, as huggingface_hub finds it.
fn hub_cache() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface").join("hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("huggingface").join("hub")))
}

/// `models--org--name/snapshots/<commit>/tokenizer.json`, where a branch or tag name is mapped
/// to its commit through `refs/`.
fn cached(cache: &Path, identifier: &str, revision: &str) -> Option<PathBuf> {
    if identifier.is_empty() || identifier.contains("..") || revision.contains("..") {
        return None;
    }
    let repo = cache.join(format!("models--{}", identifier.replace('/', "--")));
    let commit = std::fs::read_to_string(repo.join("refs").join(revision))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| revision.to_string());
    let file = repo.join("snapshots").join(commit).join("tokenizer.json");
    file.is_file().then_some(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_files_directories_and_cached_snapshots() {
        let dir = std::env::temp_dir().join(format!("deepring-pretrained-{}", std::process::id()));
        let snap = dir
            .join("models--org--tok")
            .join("snapshots")
            .join("abc123");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(dir.join("models--org--tok").join("refs")).unwrap();
        std::fs::write(snap.join("tokenizer.json"), "{}").unwrap();
        std::fs::write(
            dir.join("models--org--tok").join("refs").join("main"),
            "abc123\n",
        )
        .unwrap();
        assert_eq!(
            locate(snap.to_str().unwrap(), None).unwrap(),
            snap.join("tokenizer.json")
        );
        assert_eq!(
            cached(&dir, "org/tok", "main").unwrap(),
            snap.join("tokenizer.json")
        );
        assert_eq!(
            cached(&dir, "org/tok", "abc123").unwrap(),
            snap.join("tokenizer.json")
        );
        assert!(cached(&dir, "org/other", "main").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hub_names_say_there_is_no_download() {
        let err = locate("no-such-org/no-such-model-xyz", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not download"), "{err}");
    }
}
