use super::*;

/// A small deterministic generator (no test-only dependency).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    fn int(&mut self, lo: i32, hi: i32) -> i32 {
        lo + (self.next() % (hi - lo + 1) as u32) as i32
    }
}

struct Case {
    head: Int8Head,
    q: Vec<i8>,
    scales: Vec<f32>,
    yq: Vec<i8>,
    x: Vec<f32>,
}

fn case(seed: u64, vocab: usize, k: usize, n: usize) -> Case {
    let mut g = Lcg(seed);
    // Values at both ends of their ranges are common: the int16 pair sums' worst case.
    let q: Vec<i8> = (0..vocab * k)
        .map(|_| match g.next() % 4 {
            0 => 127,
            1 => -127,
            _ => g.int(-127, 127) as i8,
        })
        .collect();
    let scales: Vec<f32> = (0..vocab).map(|_| g.int(1, 1000) as f32 * 1e-4).collect();
    let yq: Vec<i8> = (0..n * k)
        .map(|_| match g.next() % 4 {
            0 => 63,
            1 => -63,
            _ => g.int(-63, 63) as i8,
        })
        .collect();
    let x: Vec<f32> = (0..n).map(|_| g.int(1, 1000) as f32 * 1e-3).collect();
    let head = Int8Head::new(&q, &scales, vocab, k).unwrap();
    Case {
        head,
        q,
        scales,
        yq,
        x,
    }
}

/// The approximate logit from its definition, independently of the kernels' layouts.
fn reference(c: &Case, k: usize, r: usize, j: usize) -> f32 {
    let dot: i64 = (0..k)
        .map(|i| c.yq[r * k + i] as i64 * c.q[j * k + i] as i64)
        .sum();
    dot as f32 * (c.x[r] * c.scales[j])
}

#[test]
fn logits_follow_the_definition() {
    for &(vocab, k, n) in &[(7, 1, 1), (300, 3, 9), (1000, 128, 33), (640, 130, 70)] {
        let mut c = case(vocab as u64 * 31 + k as u64, vocab, k, n);
        for portable in [false, true] {
            if portable {
                c.head.force_portable();
            }
            for threads in [1, 3] {
                let got = c.head.logits(&c.yq, n, &c.x, threads).unwrap();
                for r in 0..n {
                    for j in 0..vocab {
                        let want = reference(&c, k, r, j);
                        assert_eq!(got[r * vocab + j], want, "row {r} token {j}");
                    }
                }
            }
        }
    }
}

/// The candidates from the logits themselves: every token at or above best - 2a.
fn brute(c: &Case, n: usize, a: &[f64]) -> Found {
    let vocab = c.head.vocab();
    let logits = c.head.logits(&c.yq, n, &c.x, 2).unwrap();
    let mut f = Found::default();
    for r in 0..n {
        let row = &logits[r * vocab..][..vocab];
        let best = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        f.best.push(best);
        f.lost.push(false);
        for (j, &v) in row.iter().enumerate() {
            if v as f64 >= best as f64 - 2.0 * a[r] {
                f.rows.push(r as u32);
                f.tokens.push(j as u32);
                f.values.push(v);
            }
        }
    }
    f
}

#[test]
fn candidates_are_every_token_that_reaches_the_final_threshold() {
    for &(vocab, k, n) in &[
        (1, 4, 1),
        (7, 1, 3),
        (1000, 128, 32),
        (1003, 130, 40),
        (333, 5, 8),
        (2000, 64, 70),
    ] {
        let mut c = case(
            vocab as u64 ^ (k as u64) << 20 ^ (n as u64) << 40,
            vocab,
            k,
            n,
        );
        let mut g = Lcg(n as u64);
        // Bounds from zero (only exact ties of the best) to wide (many candidates).
        let a: Vec<f64> = (0..n)
            .map(|r| [0.0, 1e-3, 0.05, 0.3][r % 4] * g.int(1, 3) as f64)
            .collect();
        let want = brute(&c, n, &a);
        for threads in [1, 2, 3] {
            assert_eq!(
                c.head.candidates(&c.yq, n, &c.x, &a, threads).unwrap(),
                want
            );
        }
        c.head.force_portable();
        assert_eq!(c.head.candidates(&c.yq, n, &c.x, &a, 2).unwrap(), want);
    }
}

#[test]
fn a_row_with_too_many_candidates_gives_up_alone() {
    let (vocab, k, n) = (3 * CAP, 8, 2);
    let c = case(5, vocab, k, n);
    let found = c.head.candidates(&c.yq, n, &c.x, &[1e30, 0.0], 1).unwrap();
    assert_eq!(found.lost, vec![true, false]);
    assert!(found.rows.iter().all(|&r| r == 1) && !found.rows.is_empty());
}

#[test]
fn bad_arguments_are_errors() {
    let c = case(1, 10, 4, 2);
    assert!(Int8Head::new(&c.q, &c.scales, 10, 5).is_err());
    assert!(Int8Head::new(&[i8::MIN; 4], &[1.0], 1, 4).is_err());
    assert!(Int8Head::new(&[1; 4], &[f32::NAN], 1, 4).is_err());
    assert!(Int8Head::new(&[], &[], 0, 4).is_err());
    let a = [0.0, 0.0];
    assert!(c.head.candidates(&c.yq[1..], 2, &c.x, &a, 1).is_err());
    let mut yq = c.yq.clone();
    yq[3] = 64;
    assert!(c.head.candidates(&yq, 2, &c.x, &a, 1).is_err());
    assert!(c.head.candidates(&c.yq, 2, &c.x, &[0.0, -1.0], 1).is_err());
    assert!(c
        .head
        .candidates(&c.yq, 2, &c.x, &[0.0, f64::NAN], 1)
        .is_err());
    let big = Int8Head::new(&[1; 4], &[10.0], 1, 4).unwrap();
    assert!(big.candidates(&[1; 4], 1, &[f32::MAX], &[0.0], 1).is_err());
    assert!(big.candidates(&[1; 4], 1, &[1e30], &[0.0], 1).is_ok());
}

#[test]
fn thresholds_never_round_up() {
    for t in [
        1.0f64 / 3.0,
        -1.0 / 3.0,
        0.0,
        1e-310,
        -1e-310,
        1e300,
        16777217.0,
    ] {
        let f = f32_at_most(t);
        assert!(f as f64 <= t, "{t} -> {f}");
    }
    assert_eq!(f32_at_most(0.5), 0.5);
}
