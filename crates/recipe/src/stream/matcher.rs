//! The incremental marker matcher of one parser stage.
//!
//! It sees the output one byte at a time and answers, for the bytes it holds back, whether they
//! are settled text, part of a marker, or still undecided. It only counts bytes; the parser keeps
//! the held bytes themselves. Three things can hold bytes:
//!
//! - a partial match in the Aho–Corasick automaton (`</th` of `</think>`);
//! - a *newline run*: markers such as `</think>` in reasoning and `<｜DSML｜` absorb the newlines
//!   right before them (`\n*</think>`), so newlines are held while they could still be absorbed.
//!   deepseek-recipe matches each marker on its own, and a newline that breaks a partial match of
//!   a marker is text *for that marker*: `a<\n\n</think>` gives the reasoning `a<\n`, while
//!   `</th\n\n<｜DSML｜` gives `</th` (the partial `</th` was of `</think>`, not of the DSML
//!   opener). A run therefore remembers which markers had a partial match when it started, and
//!   each of those absorbs one newline less. Replicating this keeps text and token input equal
//!   to the official byte for byte.
//!
//! Everything before the earliest byte one of these still needs is settled at once: that is the
//! safe prefix the processor emits immediately (deepseek-recipe holds the whole pushed chunk
//! instead). The first marker to complete wins; at one end byte the longest marker wins.

use super::automaton::Automaton;

/// What a marker needs from the matcher besides its bytes.
pub(crate) trait MarkerKind: Copy {
    /// Absorbs the newline run right before it.
    fn absorbs_newlines(self) -> bool;
}

/// The outcome of one byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step<T> {
    /// Nothing new is settled.
    Hold,
    /// The first `n` held bytes are settled text.
    Settle(usize),
    /// A marker matched: the first `text` held bytes are settled text, the next `marker` bytes are
    /// the marker (with the newlines it absorbed). Nothing is held afterwards.
    Match { text: usize, marker: usize, tag: T },
}

/// A run of newlines in the held bytes: where it starts, how long it is, and the markers
/// (pattern index bits) that had a partial match when it began.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    start: usize,
    len: usize,
    leak: u64,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Matcher<T> {
    state: u32,
    /// Bytes held back (the last `held` bytes of the output so far).
    held: usize,
    /// The newline run a marker could still absorb.
    run: Option<Run>,
    /// The marker kind the automaton reports (typed per stage automaton).
    kind: std::marker::PhantomData<T>,
}

impl<T: MarkerKind> Matcher<T> {
    pub fn new() -> Self {
        Matcher {
            state: 0,
            held: 0,
            run: None,
            kind: std::marker::PhantomData,
        }
    }

    /// Nothing held: the next byte can be settled without the automaton unless it can start
    /// something (see [`Matcher::idle_settles`]).
    #[inline]
    pub fn idle(&self) -> bool {
        self.held == 0
    }

    /// Whether `b`, arriving while idle, is settled text at once.
    #[inline]
    pub fn idle_settles(a: &Automaton<T>, newline_runs: bool, b: u8) -> bool {
        !(a.starts(b) || (newline_runs && b == b'\n'))
    }

    /// Forget everything held (the held bytes are the caller's to flush).
    pub fn reset(&mut self) {
        self.state = 0;
        self.held = 0;
        self.run = None;
    }

    /// Feed one byte. `newline_runs`: the stage has markers that absorb newlines.
    pub fn feed(&mut self, a: &Automaton<T>, newline_runs: bool, b: u8) -> Step<T> {
        let before = self.held;
        let before_state = self.state;
        self.held += 1;
        if b == b'\n' && newline_runs {
            match &mut self.run {
                Some(r) if r.start + r.len == before => r.len += 1,
                _ => {
                    self.run = Some(Run {
                        start: before,
                        len: 1,
                        leak: a.partials(before_state),
                    })
                }
            }
        }
        self.state = a.step(before_state, b);
        if let Some((len, tag, index)) = a.output(self.state) {
            let start = self.held - len;
            let absorbed = match self.run {
                Some(r) if tag.absorbs_newlines() && r.start + r.len == start => {
                    let leaks = index < 64 && r.leak & (1 << index) != 0;
                    r.len - usize::from(leaks)
                }
                _ => 0,
            };
            let text = start - absorbed;
            let held = self.held;
            self.reset();
            return Step::Match {
                text,
                marker: held - text,
                tag,
            };
        }
        let mut earliest = self.held - a.depth(self.state);
        if let Some(r) = self.run {
            if b != b'\n' && earliest > r.start + r.len {
                // Text that starts no marker follows the newlines: they are not a prefix any more.
                self.run = None;
            } else {
                earliest = earliest.min(r.start);
            }
        }
        if earliest == 0 {
            return Step::Hold;
        }
        self.held -= earliest;
        if let Some(r) = self.run.as_mut() {
            r.start -= earliest;
        }
        Step::Settle(earliest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::automaton::Pattern;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum M {
        End,
        Stop,
    }

    impl MarkerKind for M {
        fn absorbs_newlines(self) -> bool {
            self == M::End
        }
    }

    fn automaton(pats: &[(&str, M)]) -> Automaton<M> {
        Automaton::new(
            pats.iter()
                .map(|(s, t)| Pattern {
                    bytes: s.as_bytes().to_vec(),
                    tag: *t,
                })
                .collect(),
        )
    }

    /// Run `text` to the first match: (settled text, matched marker text).
    fn run(a: &Automaton<M>, text: &str) -> (String, Option<(String, M)>) {
        let mut m = Matcher::new();
        let mut held = Vec::new();
        let mut settled = Vec::new();
        for &b in text.as_bytes() {
            held.push(b);
            match m.feed(a, true, b) {
                Step::Hold => {}
                Step::Settle(n) => settled.extend(held.drain(..n)),
                Step::Match { text, marker, tag } => {
                    settled.extend(held.drain(..text));
                    let marker: Vec<u8> = held.drain(..marker).collect();
                    return (
                        String::from_utf8(settled).unwrap(),
                        Some((String::from_utf8(marker).unwrap(), tag)),
                    );
                }
            }
        }
        settled.extend(held);
        (String::from_utf8(settled).unwrap(), None)
    }

    #[test]
    fn newline_runs_are_absorbed() {
        let a = automaton(&[("</think>", M::End)]);
        assert_eq!(
            run(&a, "ab\n\n</think>"),
            ("ab".into(), Some(("\n\n</think>".into(), M::End)))
        );
        // The official's quirk: a newline that breaks a partial match is text.
        assert_eq!(run(&a, "a<\n\n</think>").0, "a<\n");
        assert_eq!(run(&a, "a\n<\n\n</think>").0, "a\n<\n");
        assert_eq!(run(&a, "x\n<</think>").0, "x\n<");
        assert_eq!(run(&a, "a<<<\n\n\n</think>").0, "a<<<\n");
        assert_eq!(run(&a, "a\n\nb\n").0, "a\n\nb\n");
    }

    #[test]
    fn a_newline_leaks_only_for_the_marker_it_broke() {
        let a = automaton(&[("</think>", M::End), ("<|X|", M::End)]);
        assert_eq!(run(&a, "</th\n\n<|X|").0, "</th");
        assert_eq!(run(&a, "x<\n\n<|X|").0, "x<\n");
        assert_eq!(run(&a, "x<|\n\n</think>").0, "x<|");
    }

    #[test]
    fn plain_markers_keep_newlines_as_text() {
        let a = automaton(&[("STOP", M::Stop), ("\n\n\n", M::Stop)]);
        assert_eq!(
            run(&a, "ab\n\nSTOP"),
            ("ab\n\n".into(), Some(("STOP".into(), M::Stop)))
        );
        assert_eq!(run(&a, "a\n<\n\n\nb").0, "a\n<");
    }

    #[test]
    fn settles_as_early_as_possible() {
        let a = automaton(&[("</think>", M::End)]);
        let mut m = Matcher::new();
        assert_eq!(m.feed(&a, true, b'a'), Step::Settle(1));
        assert_eq!(m.feed(&a, true, b'<'), Step::Hold);
        assert_eq!(m.feed(&a, true, b'x'), Step::Settle(2));
        assert_eq!(m.feed(&a, true, b'\n'), Step::Hold);
        assert_eq!(m.feed(&a, true, b'y'), Step::Settle(2));
    }
}
