//! Character classes of the DeepSeek pre-tokenizer regexes, as Oniguruma defines them.
//!
//! The reference pre-tokenizer runs its regexes with Oniguruma, so `\p{L}` or `\s` mean whatever
//! Oniguruma's Unicode tables say. Rather than trusting another table (a different Unicode
//! version would split rare characters differently), each character is classified once by
//! asking Oniguruma itself, and the answer is kept in a table shared by all threads.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use onig::Regex;

/// `\p{N}`
pub(crate) const NUMBER: u8 = 1;
/// `\p{L}`
pub(crate) const LETTER: u8 = 1 << 1;
/// `\p{M}`
pub(crate) const MARK: u8 = 1 << 2;
/// `\p{P}`
pub(crate) const PUNCT: u8 = 1 << 3;
/// `\p{S}`
pub(crate) const SYMBOL: u8 = 1 << 4;
/// `\s`
pub(crate) const SPACE: u8 = 1 << 5;
/// `[一-龥぀-ゟ゠-ヿ]`
pub(crate) const CJK: u8 = 1 << 6;
/// Set on every computed entry, so that 0 means "not asked yet".
const KNOWN: u8 = 1 << 7;

struct Probes {
    regexes: Vec<(u8, Regex)>,
    /// One entry per code point (1.1 MB, zeroed once when the first tokenizer loads).
    table: Box<[AtomicU8]>,
}

fn probes() -> &'static Probes {
    static PROBES: OnceLock<Probes> = OnceLock::new();
    PROBES.get_or_init(|| {
        let classes = [
            (NUMBER, r"\p{N}"),
            (LETTER, r"\p{L}"),
            (MARK, r"\p{M}"),
            (PUNCT, r"\p{P}"),
            (SYMBOL, r"\p{S}"),
            (SPACE, r"\s"),
            (CJK, "[一-龥぀-ゟ゠-ヿ]"),
        ];
        let regexes = classes
            .iter()
            .filter_map(|&(bit, pattern)| Regex::new(pattern).ok().map(|r| (bit, r)))
            .collect();
        let table = (0..=char::MAX as usize).map(|_| AtomicU8::new(0)).collect();
        Probes { regexes, table }
    })
}

/// Whether every class regex compiled (they are constants; this guards the fast path anyway).
pub(crate) fn available() -> bool {
    probes().regexes.len() == 7
}

/// The class bits of `c`.
#[inline]
pub(crate) fn of(c: char) -> u8 {
    let p = probes();
    let slot = &p.table[c as usize];
    let known = slot.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    let mut buf = [0u8; 4];
    let s: &str = c.encode_utf8(&mut buf);
    let bits = p
        .regexes
        .iter()
        .filter(|(_, r)| r.is_match(s))
        .fold(KNOWN, |acc, (bit, _)| acc | bit);
    slot.store(bits, Ordering::Relaxed);
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_unicode() {
        assert!(available());
        assert_ne!(of('7') & NUMBER, 0);
        assert_ne!(of('٣') & NUMBER, 0);
        assert_ne!(of('a') & LETTER, 0);
        assert_ne!(of('\u{301}') & MARK, 0);
        assert_ne!(of('!') & PUNCT, 0);
        assert_ne!(of('+') & SYMBOL, 0);
        assert_ne!(of('\u{3000}') & SPACE, 0);
        assert_ne!(of('模') & CJK, 0);
        assert_eq!(of('x') & (NUMBER | PUNCT | SYMBOL | SPACE | CJK | MARK), 0);
    }
}
