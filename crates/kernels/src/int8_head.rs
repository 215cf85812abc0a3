//! The int8 greedy LM head's first pass (engine: `kernels/greedy_int8.py`, kind `int8-avx2`):
//! which tokens can still be a row's fp32 argmax, found without writing any logits out.
//!
//! The weight is quantised per vocabulary row (`q_j`, scale `s_j`), each row of the batch with a
//! scale of its own (`yq_r`, |values| <= 63, scale `x_r`). The approximate logit of row r and
//! token j is `f32(yq_r . q_j) * (x_r * s_j)`: an exact integer dot product, converted to fp32 and
//! scaled with two fp32 roundings. The caller knows a bound `a_r` on each approximate logit's
//! error, so token j can be the fp32 argmax of row r only if its approximate logit reaches
//! `best_r - 2 a_r` (`best_r`: the row's largest approximate logit). One pass over the vocabulary
//! keeps, per row, the tokens at or above the threshold of the largest value seen so far (which
//! only rises), and the final threshold filters them: usually a few tokens per row.
//!
//! Why this kernel (AVX2): fbgemm's int8 GEMM, the engine's other int8 head on CPUs without VNNI,
//! runs its multiplies at about half this CPU's rate for this shape (32 rows, K = 128, a 129k
//! vocabulary) and writes every logit out to be rounded, maximised and read again. Here a
//! vector holds 8 rows of the batch (4 vectors: 32 rows) and each token's weight bytes are
//! broadcast: `vpmaddubsw` multiplies the weight as unsigned bytes (`q + 128`) with the rows'
//! signed bytes (|value| <= 63, so a pair's sum never saturates int16), `vpmaddwd` by ones widens
//! to int32, and `128 * sum(yq_r)` is subtracted once per token. Nothing of a token's row of
//! logits leaves the registers unless it reaches its row's running threshold.

use crate::parts;
use std::fmt;

/// The largest |row value|: `vpmaddubsw`'s int16 pair sums hold 2 * 255 * 63 = 32130.
pub const ROW_MAX: i8 = 63;
/// Batch rows per vector and per block (4 vectors).
const LANES: usize = 8;
const BLOCK_ROWS: usize = 4 * LANES;
/// Tokens per pass over the row blocks (their weight bytes stay in L1 between blocks).
const CHUNK: usize = 128;
/// Candidates a row keeps per part before it drops those below its current threshold; a row
/// still holding more than half of them after that gives up (`Found::lost`).
const CAP: usize = 4096;
/// The largest K whose integer sums cannot overflow int32: 255 * 63 * K < 2^31 (the sums of the
/// unsigned weight bytes).
pub const MAX_K: usize = 131_072;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError(pub String);

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KernelError {}

fn fail<T>(msg: String) -> Result<T, KernelError> {
    Err(KernelError(msg))
}

/// Whether this CPU runs the AVX2 kernel (elsewhere the portable loop computes the same values).
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// An int8 LM head weight laid out for the kernel.
pub struct Int8Head {
    vocab: usize,
    k: usize,
    /// K rounded up to whole groups of 4 (the kernel reads 4 bytes per broadcast).
    kp: usize,
    /// [vocab][kp]: q + 128 (the padding columns hold 128, i.e. zero).
    wu: Vec<u8>,
    scales: Vec<f32>,
    scale_max: f32,
    avx2: bool,
}

/// The batch's rows as the kernel reads them.
struct Rows {
    n: usize,
    /// Per block of BLOCK_ROWS rows: [kp / 4][vectors][LANES][4] signed bytes (zero padding).
    act: Vec<Vec<i8>>,
    /// Per row (padded to whole vectors): 128 * sum(yq_r), and x_r.
    corr: Vec<i32>,
    x: Vec<f32>,
    a: Vec<f64>,
}

/// What `Int8Head::candidates` found: per row its largest approximate logit and whether it gave
/// up (too many candidates); and every (row, token, approximate logit) at or above its row's
/// final threshold, by row and then token.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Found {
    pub best: Vec<f32>,
    pub lost: Vec<bool>,
    pub rows: Vec<u32>,
    pub tokens: Vec<u32>,
    pub values: Vec<f32>,
}

/// The largest f32 not above t (a threshold never rounds up past the exact one).
fn f32_at_most(t: f64) -> f32 {
    let f = t as f32;
    if (f as f64) <= t || f.is_nan() {
        return f;
    }
    if f == 0.0 {
        return -f32::from_bits(1);
    }
    let bits = f.to_bits();
    f32::from_bits(if f > 0.0 { bits - 1 } else { bits + 1 })
}

/// The final threshold a row's candidates reach: best - 2a, in f64.
fn threshold(best: f32, a: f64) -> f64 {
    best as f64 - 2.0 * a
}

/// One row's search within one part of the vocabulary.
#[derive(Clone)]
struct RowState {
    a: f64,
    best: f32,
    found: Vec<(u32, f32)>,
    lost: bool,
}

impl RowState {
    fn new(a: f64) -> Self {
        Self {
            a,
            best: f32::NEG_INFINITY,
            found: Vec::new(),
            lost: false,
        }
    }

    fn threshold(&self) -> f64 {
        threshold(self.best, self.a)
    }

    /// Token j's value reached `thr` (this row's kernel threshold): keep it, raise the
    /// threshold when it is the new best.
    fn offer(&mut self, j: usize, v: f32, thr: &mut f32) {
        if self.lost {
            return;
        }
        self.found.push((j as u32, v));
        if v > self.best {
            self.best = v;
            *thr = f32_at_most(self.threshold());
        }
        if self.found.len() >= CAP {
            let t = self.threshold();
            self.found.retain(|&(_, v)| v as f64 >= t);
            if self.found.len() > CAP / 2 {
                self.lost = true;
                self.found = Vec::new();
                *thr = f32::INFINITY;
            }
        }
    }
}

impl Int8Head {
    /// `q`: the weight's int8 values, `vocab` rows of `k` (each in -127..=127); `scales`: one
    /// finite scale per row.
    pub fn new(q: &[i8], scales: &[f32], vocab: usize, k: usize) -> Result<Self, KernelError> {
        if vocab == 0 || k == 0 || k > MAX_K || vocab > u32::MAX as usize {
            return fail(format!(
                "the head needs 1 <= k <= {MAX_K} and a vocabulary, got {vocab} x {k}"
            ));
        }
        if q.len() != vocab * k || scales.len() != vocab {
            return fail(format!(
                "a {vocab} x {k} head needs {} weight values and {vocab} scales, got {} and {}",
                vocab * k,
                q.len(),
                scales.len()
            ));
        }
        if q.contains(&i8::MIN) {
            return fail("weight values must lie in -127..=127".to_string());
        }
        if scales.iter().any(|s| !s.is_finite()) {
            return fail("weight scales must be finite".to_string());
        }
        let kp = k.div_ceil(4) * 4;
        let mut wu = vec![128u8; vocab * kp];
        for (dst, src) in wu.chunks_exact_mut(kp).zip(q.chunks_exact(k)) {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = (s as i16 + 128) as u8;
            }
        }
        Ok(Self {
            vocab,
            k,
            kp,
            wu,
            scales: scales.to_vec(),
            scale_max: scales.iter().fold(0f32, |m, s| m.max(s.abs())),
            avx2: has_avx2(),
        })
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The portable loop even where AVX2 is present (tests compare the two).
    pub fn force_portable(&mut self) {
        self.avx2 = false;
    }

    fn rows(&self, yq: &[i8], n: usize, x: &[f32], a: &[f64]) -> Result<Rows, KernelError> {
        if yq.len() != n * self.k || x.len() != n || a.len() != n {
            return fail(format!(
                "{n} rows of {} columns need {} values, {n} scales and {n} bounds, got {}, {} and {}",
                self.k,
                n * self.k,
                yq.len(),
                x.len(),
                a.len()
            ));
        }
        if yq.iter().any(|v| v.unsigned_abs() > ROW_MAX as u8) {
            return fail(format!("row values must lie in -{ROW_MAX}..={ROW_MAX}"));
        }
        if x.iter().any(|v| !v.is_finite()) || a.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return fail("row scales must be finite and bounds finite and >= 0".to_string());
        }
        // (x_r * s_j must stay finite: an infinite scale times a zero dot product is NaN, which
        // no threshold compares with.)
        if x.iter().any(|v| !(v.abs() * self.scale_max).is_finite()) {
            return fail("a row scale times a weight scale overflows fp32".to_string());
        }
        let quads = self.kp / 4;
        let padded = n.div_ceil(LANES) * LANES;
        let mut corr = vec![0i32; padded];
        let mut xs = vec![0f32; padded];
        xs[..n].copy_from_slice(x);
        let mut act = Vec::new();
        for b0 in (0..padded).step_by(BLOCK_ROWS) {
            let vecs = (padded - b0).min(BLOCK_ROWS) / LANES;
            let mut block = vec![0i8; quads * vecs * LANES * 4];
            for r in b0..(b0 + vecs * LANES).min(n) {
                let row = &yq[r * self.k..][..self.k];
                corr[r] = 128 * row.iter().map(|&v| v as i32).sum::<i32>();
                let (v, lane) = ((r - b0) / LANES, (r - b0) % LANES);
                for (c, &val) in row.iter().enumerate() {
                    block[((c / 4 * vecs + v) * LANES + lane) * 4 + c % 4] = val;
                }
            }
            act.push(block);
        }
        Ok(Rows {
            n,
            act,
            corr,
            x: xs,
            a: a.to_vec(),
        })
    }

    /// The candidates of each row (module docs): yq rows x k values in -63..=63, x their scales,
    /// a the bounds on their approximate logits' errors; the vocabulary is split into `threads`
    /// parts run at once (`parts::run`).
    pub fn candidates(
        &self,
        yq: &[i8],
        n: usize,
        x: &[f32],
        a: &[f64],
        threads: usize,
    ) -> Result<Found, KernelError> {
        let rows = self.rows(yq, n, x, a)?;
        let spans = self.spans(threads);
        let results: Vec<std::sync::Mutex<Vec<RowState>>> = (0..spans.len())
            .map(|_| std::sync::Mutex::new(Vec::new()))
            .collect();
        let ok = parts::run(spans.len(), &|p| {
            let states = self.scan(&rows, spans[p].start, spans[p].end);
            if let Ok(mut slot) = results[p].lock() {
                *slot = states;
            }
        });
        if !ok {
            return fail("a part of the int8 head's scan failed".to_string());
        }
        let parts: Vec<Vec<RowState>> = results
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_default())
            .collect();
        let mut found = Found::default();
        for r in 0..n {
            let best = parts
                .iter()
                .map(|s| s[r].best)
                .fold(f32::NEG_INFINITY, f32::max);
            let lost = parts.iter().any(|s| s[r].lost);
            found.best.push(best);
            found.lost.push(lost);
            if lost {
                continue;
            }
            let t = threshold(best, a[r]);
            for (j, v) in parts.iter().flat_map(|s| s[r].found.iter()) {
                if *v as f64 >= t {
                    found.rows.push(r as u32);
                    found.tokens.push(*j);
                    found.values.push(*v);
                }
            }
        }
        Ok(found)
    }

    /// Tokens j0 .. j1 for every row: each row's search state.
    fn scan(&self, rows: &Rows, j0: usize, j1: usize) -> Vec<RowState> {
        let mut states: Vec<RowState> = rows.a.iter().map(|&a| RowState::new(a)).collect();
        let mut thr: Vec<[f32; BLOCK_ROWS]> = (0..rows.act.len())
            .map(|b| {
                let mut t = [f32::INFINITY; BLOCK_ROWS];
                for (l, v) in t.iter_mut().enumerate() {
                    if b * BLOCK_ROWS + l < rows.n {
                        *v = f32::NEG_INFINITY;
                    }
                }
                t
            })
            .collect();
        for c0 in (j0..j1).step_by(CHUNK) {
            let c1 = (c0 + CHUNK).min(j1);
            for (b, act) in rows.act.iter().enumerate() {
                let r0 = b * BLOCK_ROWS;
                let r1 = (r0 + BLOCK_ROWS).min(rows.n);
                let block = self.block(rows, act, r0);
                self.block_scan(&block, c0, c1, &mut states[r0..r1], &mut thr[b]);
            }
        }
        states
    }

    fn block_scan(
        &self,
        block: &Block<'_>,
        j0: usize,
        j1: usize,
        states: &mut [RowState],
        thr: &mut [f32; BLOCK_ROWS],
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: AVX2 was detected at construction; the block holds kp / 4 groups of
            // `vecs` vectors and corr / x at least vecs * LANES values (rows padded to whole
            // vectors), and j1 <= vocab.
            unsafe {
                match block.vecs {
                    1 => avx2::scan::<1>(self, block, j0, j1, states, thr),
                    2 => avx2::scan::<2>(self, block, j0, j1, states, thr),
                    3 => avx2::scan::<3>(self, block, j0, j1, states, thr),
                    _ => avx2::scan::<4>(self, block, j0, j1, states, thr),
                }
            }
            return;
        }
        for j in j0..j1 {
            for (l, st) in states.iter_mut().enumerate() {
                let v = self.value(block, l, j);
                if v >= thr[l] {
                    st.offer(j, v, &mut thr[l]);
                }
            }
        }
    }

    /// The approximate logit of token j for lane l of a block (the portable loop).
    fn value(&self, block: &Block<'_>, l: usize, j: usize) -> f32 {
        let (v, lane) = (l / LANES, l % LANES);
        let w = &self.wu[j * self.kp..][..self.kp];
        let mut dot = 0i32;
        for (c, &wc) in w.iter().enumerate() {
            let y = block.act[((c / 4 * block.vecs + v) * LANES + lane) * 4 + c % 4];
            // (Checked inputs cannot overflow: wrapping only keeps a bad call from panicking.)
            dot = dot.wrapping_add(wc as i32 * y as i32);
        }
        dot.wrapping_sub(block.corr[l]) as f32 * (block.x[l] * self.scales[j])
    }

    /// Every approximate logit of each row, `out[r * vocab + j]` (tests, and rows a grammar
    /// constrains), the vocabulary split into `threads` parts.
    pub fn logits(
        &self,
        yq: &[i8],
        n: usize,
        x: &[f32],
        threads: usize,
    ) -> Result<Vec<f32>, KernelError> {
        let rows = self.rows(yq, n, x, &vec![0.0; n])?;
        let mut out = vec![0f32; n * self.vocab];
        let spans = self.spans(threads);
        let base = SharedOut(out.as_mut_ptr());
        let ok = parts::run(spans.len(), &|p| {
            let (j0, j1) = (spans[p].start, spans[p].end);
            for (b, act) in rows.act.iter().enumerate() {
                let r0 = b * BLOCK_ROWS;
                let block = self.block(&rows, act, r0);
                // SAFETY: row r0 + l of `out` starts at (r0 + l) * vocab and this part writes
                // only its tokens j0 .. j1 of the block's rows below n.
                unsafe {
                    let dst = base.get().add(r0 * self.vocab);
                    self.block_store(&block, j0, j1, dst, (n - r0).min(BLOCK_ROWS));
                }
            }
        });
        if !ok {
            return fail("a part of the int8 head's logits failed".to_string());
        }
        Ok(out)
    }

    /// The vocabulary cut into up to `threads` runs of whole chunks, one per part.
    fn spans(&self, threads: usize) -> Vec<std::ops::Range<usize>> {
        let parts = threads.clamp(1, self.vocab.div_ceil(CHUNK));
        let per = self.vocab.div_ceil(parts).div_ceil(CHUNK) * CHUNK;
        (0..parts)
            .map(|p| (p * per).min(self.vocab)..((p + 1) * per).min(self.vocab))
            .collect()
    }

    fn block<'a>(&self, rows: &'a Rows, act: &'a [i8], r0: usize) -> Block<'a> {
        Block {
            act,
            vecs: act.len() / (self.kp / 4 * LANES * 4),
            corr: &rows.corr[r0..],
            x: &rows.x[r0..],
        }
    }

    /// # Safety
    /// `out[l * vocab + j]` is writable for l < rows and j0 <= j < j1 <= vocab.
    unsafe fn block_store(
        &self,
        block: &Block<'_>,
        j0: usize,
        j1: usize,
        out: *mut f32,
        rows: usize,
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: as in `block_scan`; the output as the caller promised.
            match block.vecs {
                1 => avx2::store::<1>(self, block, j0, j1, out, rows, self.vocab),
                2 => avx2::store::<2>(self, block, j0, j1, out, rows, self.vocab),
                3 => avx2::store::<3>(self, block, j0, j1, out, rows, self.vocab),
                _ => avx2::store::<4>(self, block, j0, j1, out, rows, self.vocab),
            }
            return;
        }
        for l in 0..rows {
            for j in j0..j1 {
                *out.add(l * self.vocab + j) = self.value(block, l, j);
            }
        }
    }
}

/// The logits' output shared by the parts, which write disjoint tokens.
struct SharedOut(*mut f32);

// SAFETY: the parts that share it write disjoint elements (`Int8Head::logits`).
unsafe impl Sync for SharedOut {}

impl SharedOut {
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// One block of rows as `scan` passes it to the kernels.
struct Block<'a> {
    act: &'a [i8],
    vecs: usize,
    corr: &'a [i32],
    x: &'a [f32],
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Block, Int8Head, RowState, BLOCK_ROWS, LANES};
    use std::arch::x86_64::*;

    /// The block's constants: per vector of rows, 128 * sum(yq_r) and x_r.
    #[target_feature(enable = "avx2")]
    unsafe fn setup<const NV: usize>(block: &Block<'_>) -> ([__m256i; NV], [__m256; NV]) {
        let mut corr = [_mm256_setzero_si256(); NV];
        let mut x = [_mm256_setzero_ps(); NV];
        for i in 0..NV {
            corr[i] = _mm256_loadu_si256(block.corr.as_ptr().add(i * LANES) as *const __m256i);
            x[i] = _mm256_loadu_ps(block.x.as_ptr().add(i * LANES));
        }
        (corr, x)
    }

    /// Token j's approximate logits for the block's NV vectors of rows.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn values<const NV: usize>(
        head: &Int8Head,
        act: *const i8,
        corr: &[__m256i; NV],
        x: &[__m256; NV],
        j: usize,
    ) -> [__m256; NV] {
        let ones = _mm256_set1_epi16(1);
        let w = head.wu.as_ptr().add(j * head.kp);
        let mut acc = [_mm256_setzero_si256(); NV];
        for q in 0..head.kp / 4 {
            let b = _mm256_set1_epi32((w.add(4 * q) as *const i32).read_unaligned());
            for (i, a) in acc.iter_mut().enumerate() {
                let y = _mm256_loadu_si256(act.add((q * NV + i) * 32) as *const __m256i);
                let pairs = _mm256_maddubs_epi16(b, y);
                *a = _mm256_add_epi32(*a, _mm256_madd_epi16(pairs, ones));
            }
        }
        let s = _mm256_set1_ps(*head.scales.get_unchecked(j));
        let mut v = [_mm256_setzero_ps(); NV];
        for i in 0..NV {
            let dot = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[i], corr[i]));
            v[i] = _mm256_mul_ps(dot, _mm256_mul_ps(x[i], s));
        }
        v
    }

    /// Tokens j0 .. j1 against the block's NV vectors of rows: each row's candidates.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scan<const NV: usize>(
        head: &Int8Head,
        block: &Block<'_>,
        j0: usize,
        j1: usize,
        states: &mut [RowState],
        thr: &mut [f32; BLOCK_ROWS],
    ) {
        let (corr, x) = setup::<NV>(block);
        let mut t = [_mm256_setzero_ps(); NV];
        for (i, ti) in t.iter_mut().enumerate() {
            *ti = _mm256_loadu_ps(thr.as_ptr().add(i * LANES));
        }
        for j in j0..j1 {
            let v = values::<NV>(head, block.act.as_ptr(), &corr, &x, j);
            for i in 0..NV {
                let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(v[i], t[i]));
                if hit == 0 {
                    continue;
                }
                let mut vals = [0f32; LANES];
                _mm256_storeu_ps(vals.as_mut_ptr(), v[i]);
                for (lane, &val) in vals.iter().enumerate() {
                    let l = i * LANES + lane;
                    if hit & (1 << lane) != 0 && l < states.len() {
                        states[l].offer(j, val, &mut thr[l]);
                    }
                }
                t[i] = _mm256_loadu_ps(thr.as_ptr().add(i * LANES));
            }
        }
    }

    /// Tokens j0 .. j1 against the block's rows: `out[l * stride + j]` for its first `rows`
    /// rows l (the caller's output rows of this block; other parts write other tokens).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn store<const NV: usize>(
        head: &Int8Head,
        block: &Block<'_>,
        j0: usize,
        j1: usize,
        out: *mut f32,
        rows: usize,
        stride: usize,
    ) {
        let (corr, x) = setup::<NV>(block);
        let mut vals = [0f32; BLOCK_ROWS];
        for j in j0..j1 {
            let v = values::<NV>(head, block.act.as_ptr(), &corr, &x, j);
            for (i, vi) in v.iter().enumerate() {
                _mm256_storeu_ps(vals.as_mut_ptr().add(i * LANES), *vi);
            }
            for (l, &val) in vals.iter().enumerate().take(rows) {
                *out.add(l * stride + j) = val;
            }
        }
    }
}

#[cfg(test)]
#[path = "int8_head_tests.rs"]
mod tests;
