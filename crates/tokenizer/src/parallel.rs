//! Threading model for prompt encoding.
//!
//! Plain segments of a prompt are independent, and a long segment can be cut at positions where
//! the pre-tokenizer always starts a new piece (see [`split_points`]), so encoding is a flat list
//! of independent pieces mapped in parallel. Results are concatenated in order, which makes the
//! parallel result equal to the sequential one by construction.
//!
//! Pools are rayon pools created lazily per thread count and never freed. Each remembers the pid
//! that created it: after `fork` the child's copy refers to threads that do not exist in the child,
//! so a pool whose pid differs from `getpid()` is abandoned and a fresh one is built. That keeps
//! engine processes started by `fork` from deadlocking, without the atfork handler (and the global
//! "parallelism off" switch) that tokenizers uses. No lock is taken on this path, so a fork that
//! lands while another thread is here cannot leave a mutex held in the child.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use rayon::prelude::*;

/// Largest thread count we keep a pool for; more than this is clamped.
const MAX_THREADS: usize = 64;
/// Size thresholds of the parallel path. Tests shrink them to force cuts at every qualifying
/// position; the defaults are tuned on the 1k / 32k / 256k prompts of `bench/tokenize.py`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Below this many plain bytes a prompt is encoded on the calling thread: handing work to a
    /// pool costs microseconds that a tiny prompt does not repay.
    pub parallel_min_bytes: usize,
    /// Smallest piece a long segment is cut into.
    pub min_piece_bytes: usize,
    /// Pieces per thread to aim for (more pieces balance better, each costs a little).
    pub pieces_per_thread: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            parallel_min_bytes: 1024,
            min_piece_bytes: 1024,
            pieces_per_thread: 8,
        }
    }
}

/// The thread count used when none is given explicitly: 0 means "decide from the environment".
static DEFAULT_THREADS: AtomicUsize = AtomicUsize::new(0);

struct PoolEntry {
    pid: u32,
    pool: rayon::ThreadPool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: AtomicPtr<PoolEntry> = AtomicPtr::new(std::ptr::null_mut());
static POOLS: [AtomicPtr<PoolEntry>; MAX_THREADS + 1] = [EMPTY; MAX_THREADS + 1];

/// How many threads an encode call may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Parallelism {
    /// `DEEPRING_TOKENIZER_THREADS`, else every available core; `TOKENIZERS_PARALLELISM=false`
    /// means one thread, as it does for deepseek-recipe and Hugging Face tokenizers.
    #[default]
    Auto,
    /// Exactly this many threads (1 = sequential on the calling thread).
    Threads(usize),
}

/// Set the process-wide thread count used by [`Parallelism::Auto`]; 0 restores the default.
pub fn set_default_threads(threads: usize) {
    DEFAULT_THREADS.store(threads, Ordering::Relaxed);
}

impl Parallelism {
    pub fn threads(self) -> usize {
        match self {
            Parallelism::Threads(n) => n.clamp(1, MAX_THREADS),
            Parallelism::Auto => auto_threads(),
        }
    }
}

fn auto_threads() -> usize {
    let configured = DEFAULT_THREADS.load(Ordering::Relaxed);
    if configured > 0 {
        return configured.min(MAX_THREADS);
    }
    if let Some(n) = std::env::var("DEEPRING_TOKENIZER_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n.min(MAX_THREADS);
    }
    if std::env::var("TOKENIZERS_PARALLELISM")
        .map(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "0" | "false" | "off" | "no"
            )
        })
        .unwrap_or(false)
    {
        return 1;
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(MAX_THREADS)
}

fn pool(threads: usize) -> Option<&'static rayon::ThreadPool> {
    let slot = &POOLS[threads];
    let pid = std::process::id();
    let current = slot.load(Ordering::Acquire);
    // SAFETY: entries are leaked boxes, never freed, so a non-null pointer stays valid.
    if let Some(entry) = unsafe { current.as_ref() } {
        if entry.pid == pid {
            return Some(&entry.pool);
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("deepring-tok-{i}"))
        .build()
        .ok()?;
    let fresh = Box::into_raw(Box::new(PoolEntry { pid, pool }));
    match slot.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
        // The entry we replaced (if any) belongs to a parent process: leak it, its threads are gone.
        Ok(_) => unsafe { fresh.as_ref() }.map(|e| &e.pool),
        Err(winner) => {
            // Another thread installed a pool first; drop ours and use theirs if it is ours too.
            drop(unsafe { Box::from_raw(fresh) });
            unsafe { winner.as_ref() }
                .filter(|e| e.pid == pid)
                .map(|e| &e.pool)
        }
    }
}

/// Run `job` on a pool thread (so the caller can go on), or on the calling thread when no pool can
/// be had. The job hands its result back through a channel.
pub(crate) fn spawn(threads: usize, job: impl FnOnce() + Send + 'static) {
    match pool(threads.max(2)) {
        Some(pool) => pool.spawn(job),
        None => job(),
    }
}

/// The first position at or after `from` where `text` can be cut without changing how it
/// pre-tokenizes (see [`split_points`]).
pub(crate) fn cut_at_or_after(text: &str, from: usize) -> Option<usize> {
    let from = from.max(1);
    if from >= text.len() {
        return None;
    }
    find_cut(text, text.as_bytes(), from, text.len())
}

/// Map `f` over `items`, in parallel when `threads > 1` and the work is large enough.
/// The output is in input order.
pub(crate) fn map_pieces<T, F>(
    threads: usize,
    total_bytes: usize,
    tuning: Tuning,
    items: &[&str],
    f: F,
) -> Vec<T>
where
    T: Send,
    F: Fn(&str) -> T + Sync,
{
    if threads <= 1 || items.len() <= 1 || total_bytes < tuning.parallel_min_bytes {
        return items.iter().map(|s| f(s)).collect();
    }
    match pool(threads) {
        Some(pool) => pool.install(|| items.par_iter().map(|s| f(s)).collect()),
        None => items.iter().map(|s| f(s)).collect(),
    }
}

/// Cut `text` into pieces of roughly `target` bytes at positions where the DeepSeek pre-tokenizer
/// always begins a new piece, so that pre-tokenizing the pieces separately gives the same words as
/// pre-tokenizing the whole.
///
/// Two kinds of position qualify (`p` is a byte offset, `text[p]` the character starting there):
/// - after a `\n` and before a non-whitespace character: every alternative of the split regex that
///   can match a newline stops at the first non-newline, non-space character, and the newline is
///   always matched (by `\s*[\r\n]+`), so a piece ends exactly at `p`;
/// - before a space that sits between two alphabetic characters: the letter run ends at the space,
///   and ` word` is matched as one piece starting at the space.
///
/// Neither the digit split nor the CJK split can span such a position. Property tests compare the
/// result with unsplit encoding on arbitrary text.
pub(crate) fn split_points(text: &str, target: usize, min_piece: usize) -> Vec<&str> {
    let target = target.max(min_piece).max(1);
    if text.len() < 2 * target {
        return vec![text];
    }
    let bytes = text.as_bytes();
    let mut pieces = Vec::with_capacity(text.len() / target + 1);
    let mut start = 0;
    while text.len() - start >= 2 * target {
        let from = start + target;
        match find_cut(text, bytes, from, (from + target).min(text.len())) {
            Some(cut) => {
                pieces.push(&text[start..cut]);
                start = cut;
            }
            None => break,
        }
    }
    pieces.push(&text[start..]);
    pieces
}

/// First qualifying cut position in `[from, to)`, searched on char boundaries.
fn find_cut(text: &str, bytes: &[u8], from: usize, to: usize) -> Option<usize> {
    let mut fallback = None;
    let mut p = from;
    while p < to {
        if !text.is_char_boundary(p) {
            p += 1;
            continue;
        }
        if bytes[p - 1] == b'\n' {
            if let Some(c) = text[p..].chars().next() {
                if !c.is_whitespace() {
                    return Some(p);
                }
            }
        } else if fallback.is_none() && bytes[p] == b' ' {
            let before = text[..p].chars().next_back();
            let after = text[p + 1..].chars().next();
            if let (Some(b), Some(a)) = (before, after) {
                if b.is_alphabetic() && a.is_alphabetic() {
                    fallback = Some(p);
                }
            }
        }
        p += 1;
    }
    fallback
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_one_piece() {
        assert_eq!(split_points("hello world", 4096, 1024), vec!["hello world"]);
    }

    #[test]
    fn pieces_cover_the_text_in_order() {
        let text = "word ".repeat(5000) + &"line\n".repeat(5000);
        let pieces = split_points(&text, 2048, 1024);
        assert!(pieces.len() > 4);
        assert_eq!(pieces.concat(), text);
    }

    #[test]
    fn pool_is_rebuilt_for_a_new_thread_count() {
        let a = pool(2).map(|p| p.current_num_threads());
        let b = pool(3).map(|p| p.current_num_threads());
        assert_eq!((a, b), (Some(2), Some(3)));
        assert!(std::ptr::eq(pool(2).unwrap(), pool(2).unwrap()));
    }
}
