//! A small Aho–Corasick automaton over bytes, built per parser stage.
//!
//! The alphabet is the byte: model text is UTF-8, and the two special tokens the parser reacts to
//! in token input are the bytes 0xFE / 0xFF, which never occur in UTF-8 (see [`super::input`]).
//! Pattern sets are tiny (a handful of markers and stop sequences), so each state keeps a short
//! sorted transition list and a failure link instead of a dense 256-entry row: building one costs
//! a few hundred nanoseconds, which matters because every processor builds its own.
//!
//! The matcher never rescans input: each byte moves the state once (plus failure links), and the
//! output of a state is the longest pattern ending there (dictionary suffix links are folded in at
//! build time), which is how "the first marker to complete wins" is decided.

/// One pattern: its bytes and the caller's tag.
#[derive(Clone, Debug)]
pub(crate) struct Pattern<T> {
    pub bytes: Vec<u8>,
    pub tag: T,
}

#[derive(Clone, Debug)]
struct State {
    /// (byte, next state), sorted by byte.
    next: Vec<(u8, u32)>,
    fail: u32,
    depth: u32,
    /// The longest pattern that ends in this state (its index), including suffix matches.
    out: Option<u32>,
    /// Patterns (bit = index, first 64) of which this state or a state on its failure chain is a
    /// prefix: the patterns with a partial match in progress.
    partial: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct Automaton<T> {
    states: Vec<State>,
    patterns: Vec<Pattern<T>>,
    /// Bytes that leave the root state: anything else is settled text at once.
    starts: [bool; 256],
}

impl<T: Copy> Automaton<T> {
    /// Build from patterns; empty patterns are ignored (they would match everywhere).
    pub fn new(patterns: Vec<Pattern<T>>) -> Self {
        let patterns: Vec<Pattern<T>> = patterns
            .into_iter()
            .filter(|p| !p.bytes.is_empty())
            .collect();
        let mut states = vec![State {
            next: Vec::new(),
            fail: 0,
            depth: 0,
            out: None,
            partial: 0,
        }];
        let mut starts = [false; 256];
        for (index, pattern) in patterns.iter().enumerate() {
            starts[pattern.bytes[0] as usize] = true;
            let mut s = 0usize;
            for &b in &pattern.bytes {
                s = match find(&states[s].next, b) {
                    Some(n) => n as usize,
                    None => {
                        let n = states.len() as u32;
                        let depth = states[s].depth + 1;
                        states.push(State {
                            next: Vec::new(),
                            fail: 0,
                            depth,
                            out: None,
                            partial: 0,
                        });
                        let row = &mut states[s].next;
                        let at = row.partition_point(|&(x, _)| x < b);
                        row.insert(at, (b, n));
                        n as usize
                    }
                };
                if index < 64 {
                    states[s].partial |= 1 << index;
                }
            }
            // Two patterns with the same bytes: the first one wins.
            if states[s].out.is_none() {
                states[s].out = Some(index as u32);
            }
        }
        // Breadth-first failure links; a state's output falls back to its failure state's output
        // (a shorter pattern ending at the same byte).
        let mut queue = std::collections::VecDeque::new();
        for &(_, n) in &states[0].next {
            queue.push_back(n as usize);
        }
        while let Some(s) = queue.pop_front() {
            let row = states[s].next.clone();
            for (b, n) in row {
                let n = n as usize;
                let mut f = states[s].fail as usize;
                let fail = loop {
                    if let Some(t) = find(&states[f].next, b) {
                        break t;
                    }
                    if f == 0 {
                        break 0;
                    }
                    f = states[f].fail as usize;
                };
                states[n].fail = fail;
                if states[n].out.is_none() {
                    states[n].out = states[fail as usize].out;
                }
                states[n].partial |= states[fail as usize].partial;
                queue.push_back(n);
            }
        }
        Automaton {
            states,
            patterns,
            starts,
        }
    }

    /// The state after reading `b` in state `s`.
    #[inline]
    pub fn step(&self, mut s: u32, b: u8) -> u32 {
        loop {
            if let Some(n) = find(&self.states[s as usize].next, b) {
                return n;
            }
            if s == 0 {
                return 0;
            }
            s = self.states[s as usize].fail;
        }
    }

    /// Length of the partial match state `s` stands for.
    #[inline]
    pub fn depth(&self, s: u32) -> usize {
        self.states[s as usize].depth as usize
    }

    /// The longest pattern ending in state `s`: its length, tag and index.
    #[inline]
    pub fn output(&self, s: u32) -> Option<(usize, T, usize)> {
        self.states[s as usize].out.map(|i| {
            let p = &self.patterns[i as usize];
            (p.bytes.len(), p.tag, i as usize)
        })
    }

    /// The patterns (bit = index) with a partial match in progress in state `s`.
    #[inline]
    pub fn partials(&self, s: u32) -> u64 {
        self.states[s as usize].partial
    }

    /// Whether `b` can begin a pattern.
    #[inline]
    pub fn starts(&self, b: u8) -> bool {
        self.starts[b as usize]
    }
}

#[inline]
fn find(row: &[(u8, u32)], b: u8) -> Option<u32> {
    // Rows hold a handful of entries: a linear scan beats a binary search here.
    row.iter().find(|&&(x, _)| x == b).map(|&(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(words: &[&str]) -> Automaton<usize> {
        Automaton::new(
            words
                .iter()
                .enumerate()
                .map(|(i, w)| Pattern {
                    bytes: w.as_bytes().to_vec(),
                    tag: i,
                })
                .collect(),
        )
    }

    /// (end offset, tag) of the first match, scanning from the start.
    fn first(a: &Automaton<usize>, text: &str) -> Option<(usize, usize)> {
        let mut s = 0;
        for (i, &b) in text.as_bytes().iter().enumerate() {
            s = a.step(s, b);
            if let Some((_, tag, _)) = a.output(s) {
                return Some((i + 1, tag));
            }
        }
        None
    }

    #[test]
    fn first_completed_pattern_wins() {
        let a = build(&["</think>", "STOP", "b"]);
        assert_eq!(first(&a, "xx</think>"), Some((10, 0)));
        assert_eq!(first(&a, "a<</think>"), Some((10, 0)));
        assert_eq!(first(&a, "aSTSTOP"), Some((7, 1)));
        // "b" ends inside the partial "ab…" of nothing, and first.
        assert_eq!(first(&a, "</thab"), Some((6, 2)));
    }

    #[test]
    fn longest_output_at_the_same_end() {
        let a = build(&["k>", "</think>"]);
        assert_eq!(first(&a, "</think>"), Some((8, 1)));
        assert_eq!(first(&a, "k>"), Some((2, 0)));
    }

    #[test]
    fn depth_tracks_the_partial() {
        let a = build(&["</think>"]);
        let mut s = 0;
        for &b in b"a</th" {
            s = a.step(s, b);
        }
        assert_eq!(a.depth(s), 4);
        s = a.step(s, b'<');
        assert_eq!(a.depth(s), 1);
        assert!(a.starts(b'<'));
        assert!(!a.starts(b'a'));
    }

    #[test]
    fn empty_patterns_are_ignored() {
        let a = build(&["", "x"]);
        assert_eq!(first(&a, "abx"), Some((3, 1)));
    }
}
