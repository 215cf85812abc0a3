//! The int8 greedy LM head's first pass (engine: `kernels/greedy_head.py`, kind `int8-avx2`).
//!
//! For rows quantised to int8 (`yq`, one scale `x` for the batch) and a weight quantised to int8
//! per vocabulary row (scale `s_j`), the approximate logit of row r and token j is
//! `f32(yq_r . q_j) * (x * s_j)`: an exact int32 dot product, converted to fp32 and scaled with
//! two fp32 roundings. `Int8Head::tile_max` returns only the largest of them in each tile of
//! [`TILE`] tokens, so the logits never reach memory; the engine then computes fp32 logits only
//! for the tiles that can hold the fp32 argmax. `Int8Head::logits` returns the same values for
//! every token, for the few rows that need them all (grammar-constrained rows).
//!
//! Why not fbgemm's int8 GEMM (which the engine also uses): on an AVX2-only CPU it reached about
//! half the multiply rate of `vpmaddwd` for this shape (32 rows, K = 128, a 129k vocabulary),
//! and it writes every logit out. Here the weight is packed for `vpmaddwd`: 8 tokens per vector,
//! their int8 values of two adjacent columns sign-extended to int16 pairs, multiplied by a row's
//! column pair broadcast to every lane; 4 rows x 16 tokens accumulate in registers.

use std::fmt;

/// Tokens per tile whose maximum `tile_max` reports.
pub const TILE: usize = 128;
/// Tokens per AVX2 vector of int32 lanes.
const LANES: usize = 8;
/// Tokens per microkernel step: two vectors.
const STEP: usize = 2 * LANES;
/// Rows per microkernel block: 4 rows x 2 vectors of int32 sums, 4 running maxima, two weight
/// vectors and a broadcast row pair use 15 of AVX2's 16 vector registers.
const ROW_BLOCK: usize = 4;
/// The largest K whose int32 sums cannot overflow: 127 * 127 * K < 2^31.
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

/// An int8 LM head weight packed for the kernel.
pub struct Int8Head {
    vocab: usize,
    k: usize,
    /// Column pairs: ceil(k / 2) (an odd K gets a zero column).
    pairs: usize,
    tiles: usize,
    /// [group of LANES tokens][pair][lane][2], padded with zero tokens to whole tiles.
    packed: Vec<i8>,
    /// Per token, padded with zeros to whole tiles.
    scales: Vec<f32>,
    avx2: bool,
}

impl Int8Head {
    /// `q`: the weight's int8 values, `vocab` rows of `k` (each in -127..=127); `scales`: one
    /// finite scale per row.
    pub fn new(q: &[i8], scales: &[f32], vocab: usize, k: usize) -> Result<Self, KernelError> {
        if vocab == 0 || k == 0 || k > MAX_K {
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
        let pairs = k.div_ceil(2);
        let tiles = vocab.div_ceil(TILE);
        let mut packed = vec![0i8; tiles * TILE * pairs * 2];
        for (tok, row) in q.chunks_exact(k).enumerate() {
            let (group, lane) = (tok / LANES, tok % LANES);
            for (c, &v) in row.iter().enumerate() {
                packed[((group * pairs + c / 2) * LANES + lane) * 2 + c % 2] = v;
            }
        }
        let mut padded = scales.to_vec();
        padded.resize(tiles * TILE, 0.0);
        Ok(Self {
            vocab,
            k,
            pairs,
            tiles,
            packed,
            scales: padded,
            avx2: has_avx2(),
        })
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn tiles(&self) -> usize {
        self.tiles
    }

    /// Words per row of `tile_max_part`'s pairs: ceil(k / 2).
    pub fn pairs(&self) -> usize {
        self.pairs
    }

    /// The portable loop even where AVX2 is present (tests compare the two).
    pub fn force_portable(&mut self) {
        self.avx2 = false;
    }

    /// Rows' column pairs as the kernel broadcasts them: `rows` x `pairs` int32 words, each the
    /// two int16 values of columns 2p and 2p + 1.
    fn row_pairs(&self, yq: &[i16], rows: usize, x: f32) -> Result<Vec<i32>, KernelError> {
        if yq.len() != rows * self.k {
            return fail(format!(
                "{rows} rows of {} columns need {} values, got {}",
                self.k,
                rows * self.k,
                yq.len()
            ));
        }
        if yq.iter().any(|v| v.unsigned_abs() > 127) {
            return fail("row values must lie in -127..=127".to_string());
        }
        if !x.is_finite() {
            return fail("the rows' scale must be finite".to_string());
        }
        let mut out = vec![0i32; rows * self.pairs];
        for (r, row) in yq.chunks_exact(self.k).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                let word = &mut out[r * self.pairs + c / 2];
                *word |= ((v as u16 as u32) << (16 * (c % 2))) as i32;
            }
        }
        Ok(out)
    }

    /// `out[t * rows + r]`: the largest approximate logit of row r among tile t's tokens (those
    /// below the vocabulary size). Tiles are split into `threads` contiguous runs.
    pub fn tile_max(
        &self,
        yq: &[i16],
        rows: usize,
        x: f32,
        out: &mut [f32],
        threads: usize,
    ) -> Result<(), KernelError> {
        let pairs = self.row_pairs(yq, rows, x)?;
        if out.len() != self.tiles * rows {
            return fail(format!(
                "tile maxima need {} values, got {}",
                self.tiles * rows,
                out.len()
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        let per = self.tiles.div_ceil(threads.clamp(1, self.tiles));
        let run = |t0: usize, chunk: &mut [f32]| {
            for (i, col) in chunk.chunks_exact_mut(rows).enumerate() {
                self.tile(&pairs, rows, x, t0 + i, col);
            }
        };
        if per >= self.tiles {
            run(0, out);
            return Ok(());
        }
        std::thread::scope(|scope| {
            let mut chunks = out.chunks_mut(per * rows).enumerate();
            let first = chunks.next();
            for (i, chunk) in chunks {
                scope.spawn(move || run(i * per, chunk));
            }
            if let Some((_, chunk)) = first {
                run(0, chunk); // this thread takes the first run
            }
        });
        Ok(())
    }

    /// `out[r * vocab + j]`: every approximate logit of each row (the values `tile_max` takes
    /// the maxima of).
    pub fn logits(
        &self,
        yq: &[i16],
        rows: usize,
        x: f32,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let pairs = self.row_pairs(yq, rows, x)?;
        if out.len() != rows * self.vocab {
            return fail(format!(
                "logits need {} values, got {}",
                rows * self.vocab,
                out.len()
            ));
        }
        let mut buf = vec![0f32; rows * STEP];
        for base in (0..self.vocab).step_by(STEP) {
            self.step_values(&pairs, rows, x, base, &mut buf);
            let n = STEP.min(self.vocab - base);
            for r in 0..rows {
                out[r * self.vocab + base..][..n].copy_from_slice(&buf[r * STEP..][..n]);
            }
        }
        Ok(())
    }

    /// One tile's maxima for every row into `col` (rows values).
    fn tile(&self, pairs: &[i32], rows: usize, x: f32, tile: usize, col: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: AVX2 was detected at construction; indices stay within the packed
            // weight (whole tiles), `pairs` (rows x pairs) and `col` (rows), as the callers
            // checked their lengths.
            unsafe { avx2::tile(self, pairs, rows, x, tile, col) };
            return;
        }
        let mut buf = vec![0f32; rows * STEP];
        col.fill(f32::NEG_INFINITY);
        for base in (tile * TILE..(tile + 1) * TILE).step_by(STEP) {
            if base >= self.vocab {
                break;
            }
            self.portable_values(pairs, 0..rows, x, base, &mut buf);
            for (r, m) in col.iter_mut().enumerate() {
                for &v in &buf[r * STEP..][..STEP.min(self.vocab - base)] {
                    if v > *m {
                        *m = v;
                    }
                }
            }
        }
    }

    /// The values of tokens base .. base + STEP for every row into buf[r * STEP + i].
    fn step_values(&self, pairs: &[i32], rows: usize, x: f32, base: usize, buf: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: as in `tile`; base is below the vocabulary and a multiple of STEP.
            unsafe { avx2::step_values(self, pairs, rows, x, base, buf) };
            return;
        }
        self.portable_values(pairs, 0..rows, x, base, buf);
    }

    /// `tile_max` for tiles t0 .. t0 + out.len() / rows only, on this thread, for a caller that
    /// runs parts on threads of its own: `out[(t - t0) * rows + r]`. `pairs`: the rows' column
    /// pairs, rows x `pairs()` words of two int16 values (low half: the even column), as the
    /// memory of an int16 rows x k array reads where k is even.
    pub fn tile_max_range(
        &self,
        pairs: &[i32],
        rows: usize,
        x: f32,
        out: &mut [f32],
        t0: usize,
    ) -> Result<(), KernelError> {
        let n = out.len().checked_div(rows).unwrap_or(0);
        if pairs.len() != rows * self.pairs || n * rows != out.len() || t0 + n > self.tiles {
            return fail(format!(
                "tiles {t0} + {n} of {}: {rows} rows need {} pair words, got {}",
                self.tiles,
                rows * self.pairs,
                pairs.len()
            ));
        }
        if !x.is_finite() {
            return fail("the rows' scale must be finite".to_string());
        }
        let in_range = |h: i32| (-127..=127).contains(&h);
        if pairs
            .iter()
            .any(|&w| !in_range(w >> 16) || !in_range((w as i16) as i32))
        {
            return fail("row values must lie in -127..=127".to_string());
        }
        for (i, col) in out.chunks_exact_mut(rows.max(1)).enumerate() {
            self.tile(pairs, rows, x, t0 + i, col);
        }
        Ok(())
    }

    /// `out[i * TILE + j]`: the approximate logit of row `rows_of[i]` and token j of tile
    /// `tiles_of[i]` (-inf past the vocabulary): the tiles whose maxima reached a row's
    /// threshold, searched token by token.
    pub fn tile_values(
        &self,
        yq: &[i16],
        rows: usize,
        x: f32,
        rows_of: &[u32],
        tiles_of: &[u32],
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let pairs = self.row_pairs(yq, rows, x)?;
        if rows_of.len() != tiles_of.len() || out.len() != rows_of.len() * TILE {
            return fail(format!(
                "{} rows and {} tiles need {} values, got {}",
                rows_of.len(),
                tiles_of.len(),
                rows_of.len() * TILE,
                out.len()
            ));
        }
        for (i, (&r, &t)) in rows_of.iter().zip(tiles_of).enumerate() {
            let (r, t) = (r as usize, t as usize);
            if r >= rows || t >= self.tiles {
                return fail(format!(
                    "row {r} / tile {t} out of range ({rows} rows, {} tiles)",
                    self.tiles
                ));
            }
            for (s, chunk) in out[i * TILE..][..TILE].chunks_exact_mut(STEP).enumerate() {
                let base = t * TILE + s * STEP;
                if base >= self.vocab {
                    chunk.fill(f32::NEG_INFINITY);
                    continue;
                }
                self.row_step(&pairs, r, x, base, chunk);
                for v in &mut chunk[STEP.min(self.vocab - base)..] {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    /// The values of tokens base .. base + STEP for row r into buf[..STEP].
    fn row_step(&self, pairs: &[i32], r: usize, x: f32, base: usize, buf: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: as in `tile`; r < rows and base is below the vocabulary.
            unsafe { avx2::row_step(self, pairs, r, x, base, buf) };
            return;
        }
        self.portable_values(pairs, r..r + 1, x, base, buf);
    }

    /// The values of tokens base .. base + STEP for rows `rows` into buf[(r - rows.start) * STEP + i].
    fn portable_values(
        &self,
        pairs: &[i32],
        rows: std::ops::Range<usize>,
        x: f32,
        base: usize,
        buf: &mut [f32],
    ) {
        let r0 = rows.start;
        for i in 0..STEP {
            let tok = base + i;
            let (group, lane) = (tok / LANES, tok % LANES);
            let c = x * self.scales[tok];
            for r in rows.clone() {
                let mut dot = 0i32;
                for p in 0..self.pairs {
                    let w = &self.packed[((group * self.pairs + p) * LANES + lane) * 2..][..2];
                    let word = pairs[r * self.pairs + p];
                    // (Checked inputs cannot overflow: wrapping only keeps a bad call from
                    // panicking.)
                    let pair = w[0] as i32 * (word as i16) as i32 + w[1] as i32 * (word >> 16);
                    dot = dot.wrapping_add(pair);
                }
                buf[(r - r0) * STEP + i] = dot as f32 * c;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Int8Head, LANES, ROW_BLOCK, STEP, TILE};
    use std::arch::x86_64::*;

    /// The approximate logits of rows r0 .. r0 + NR for tokens base .. base + STEP (two vectors
    /// of LANES tokens each).
    #[inline(always)]
    unsafe fn values<const NR: usize>(
        head: &Int8Head,
        pairs: &[i32],
        r0: usize,
        x: __m256,
        base: usize,
    ) -> [[__m256; 2]; NR] {
        let n = head.pairs;
        let w0p = head.packed.as_ptr().add(base / LANES * n * LANES * 2);
        let w1p = w0p.add(n * LANES * 2);
        let yp = pairs.as_ptr().add(r0 * n);
        let mut acc = [[_mm256_setzero_si256(); 2]; NR];
        for p in 0..n {
            let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(w0p.add(p * 16) as *const __m128i));
            let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(w1p.add(p * 16) as *const __m128i));
            for (r, a) in acc.iter_mut().enumerate() {
                let yb = _mm256_set1_epi32(*yp.add(r * n + p));
                a[0] = _mm256_add_epi32(a[0], _mm256_madd_epi16(w0, yb));
                a[1] = _mm256_add_epi32(a[1], _mm256_madd_epi16(w1, yb));
            }
        }
        let sp = head.scales.as_ptr().add(base);
        let c = [
            _mm256_mul_ps(x, _mm256_loadu_ps(sp)),
            _mm256_mul_ps(x, _mm256_loadu_ps(sp.add(LANES))),
        ];
        let mut out = [[_mm256_setzero_ps(); 2]; NR];
        for (o, a) in out.iter_mut().zip(acc) {
            for h in 0..2 {
                o[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(a[h]), c[h]);
            }
        }
        out
    }

    /// -inf in the lanes of tokens at or past the vocabulary size.
    #[inline(always)]
    unsafe fn past_vocab(v: __m256, first: usize, vocab: usize) -> __m256 {
        let idx = _mm256_add_epi32(
            _mm256_set1_epi32(first as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(vocab as i32), idx);
        _mm256_blendv_ps(
            _mm256_set1_ps(f32::NEG_INFINITY),
            v,
            _mm256_castsi256_ps(keep),
        )
    }

    #[inline(always)]
    unsafe fn block<const NR: usize>(
        head: &Int8Head,
        pairs: &[i32],
        r0: usize,
        x: __m256,
        tile: usize,
        col: &mut [f32],
    ) {
        let mut m = [_mm256_set1_ps(f32::NEG_INFINITY); NR];
        for base in (tile * TILE..(tile + 1) * TILE).step_by(STEP) {
            if base >= head.vocab {
                break;
            }
            let tail = head.vocab - base < STEP;
            for (mr, mut v) in m.iter_mut().zip(values::<NR>(head, pairs, r0, x, base)) {
                if tail {
                    v[0] = past_vocab(v[0], base, head.vocab);
                    v[1] = past_vocab(v[1], base + LANES, head.vocab);
                }
                *mr = _mm256_max_ps(*mr, _mm256_max_ps(v[0], v[1]));
            }
        }
        for (r, mr) in m.iter().enumerate() {
            let mut lanes = [0f32; LANES];
            _mm256_storeu_ps(lanes.as_mut_ptr(), *mr);
            col[r0 + r] = lanes
                .iter()
                .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn tile(
        head: &Int8Head,
        pairs: &[i32],
        rows: usize,
        x: f32,
        tile: usize,
        col: &mut [f32],
    ) {
        let xv = _mm256_set1_ps(x);
        let mut r0 = 0;
        while r0 + ROW_BLOCK <= rows {
            block::<ROW_BLOCK>(head, pairs, r0, xv, tile, col);
            r0 += ROW_BLOCK;
        }
        match rows - r0 {
            3 => block::<3>(head, pairs, r0, xv, tile, col),
            2 => block::<2>(head, pairs, r0, xv, tile, col),
            1 => block::<1>(head, pairs, r0, xv, tile, col),
            _ => {}
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn row_step(
        head: &Int8Head,
        pairs: &[i32],
        r: usize,
        x: f32,
        base: usize,
        buf: &mut [f32],
    ) {
        let v = values::<1>(head, pairs, r, _mm256_set1_ps(x), base)[0];
        _mm256_storeu_ps(buf.as_mut_ptr(), v[0]);
        _mm256_storeu_ps(buf.as_mut_ptr().add(LANES), v[1]);
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn step_values(
        head: &Int8Head,
        pairs: &[i32],
        rows: usize,
        x: f32,
        base: usize,
        buf: &mut [f32],
    ) {
        let xv = _mm256_set1_ps(x);
        for r in 0..rows {
            let v = values::<1>(head, pairs, r, xv, base)[0];
            _mm256_storeu_ps(buf.as_mut_ptr().add(r * STEP), v[0]);
            _mm256_storeu_ps(buf.as_mut_ptr().add(r * STEP + LANES), v[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (no rand dependency).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) as u32
        }
        fn int(&mut self, lim: i32) -> i32 {
            (self.next() % (2 * lim as u32 + 1)) as i32 - lim
        }
    }

    fn case(vocab: usize, k: usize, rows: usize, seed: u64) -> (Vec<i8>, Vec<f32>, Vec<i16>) {
        let mut g = Lcg(seed);
        let q = (0..vocab * k).map(|_| g.int(127) as i8).collect();
        let s = (0..vocab)
            .map(|_| (g.next() % 1000 + 1) as f32 * 1e-4)
            .collect();
        let y = (0..rows * k).map(|_| g.int(127) as i16).collect();
        (q, s, y)
    }

    /// The definition, in plain loops over the unpacked values.
    fn reference(q: &[i8], s: &[f32], y: &[i16], k: usize, x: f32) -> Vec<Vec<f32>> {
        y.chunks(k)
            .map(|yr| {
                q.chunks(k)
                    .zip(s)
                    .map(|(qr, &sj)| {
                        let dot: i32 = qr.iter().zip(yr).map(|(&a, &b)| a as i32 * b as i32).sum();
                        dot as f32 * (x * sj)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn tile_max_and_logits_match_the_definition() {
        // Vocabularies off tile and step boundaries, odd K, row counts off the row block.
        for &(vocab, k, rows, threads) in &[
            (300, 7, 5, 2),
            (128, 128, 32, 3),
            (1000, 64, 1, 1),
            (17, 2, 4, 8),
            (257, 33, 6, 2),
        ] {
            let (q, s, y) = case(vocab, k, rows, (vocab * k + rows) as u64);
            let x = 0.0123f32;
            let want = reference(&q, &s, &y, k, x);
            for portable in [false, true] {
                let mut head = Int8Head::new(&q, &s, vocab, k).unwrap();
                if portable {
                    head.force_portable();
                }
                let mut maxima = vec![0f32; head.tiles() * rows];
                head.tile_max(&y, rows, x, &mut maxima, threads).unwrap();
                let mut logits = vec![0f32; rows * vocab];
                head.logits(&y, rows, x, &mut logits).unwrap();
                for r in 0..rows {
                    assert_eq!(
                        &logits[r * vocab..][..vocab],
                        &want[r][..],
                        "{vocab} {k} {rows}"
                    );
                    for t in 0..head.tiles() {
                        let m = want[r][t * TILE..vocab.min((t + 1) * TILE)]
                            .iter()
                            .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                        assert_eq!(
                            maxima[t * rows + r],
                            m,
                            "tile {t} row {r} portable {portable}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn tile_ranges_add_up_to_tile_max() {
        let (vocab, k, rows) = (1000, 64, 6);
        let (q, s, y) = case(vocab, k, rows, 7);
        let head = Int8Head::new(&q, &s, vocab, k).unwrap();
        let mut whole = vec![0f32; head.tiles() * rows];
        head.tile_max(&y, rows, 0.5, &mut whole, 1).unwrap();
        let pairs: Vec<i32> = y
            .chunks(2)
            .map(|p| ((p[0] as u16 as u32) | ((p[1] as u16 as u32) << 16)) as i32)
            .collect();
        let mut parts = vec![0f32; head.tiles() * rows];
        let (a, b) = parts.split_at_mut(3 * rows);
        head.tile_max_range(&pairs, rows, 0.5, a, 0).unwrap();
        head.tile_max_range(&pairs, rows, 0.5, b, 3).unwrap();
        assert_eq!(parts, whole);
        assert!(head
            .tile_max_range(&pairs, rows, 0.5, &mut vec![0f32; rows * 6], 3)
            .is_err());
        let bad: Vec<i32> = pairs.iter().map(|_| 200).collect(); // low halves of 200
        assert!(head
            .tile_max_range(&bad, rows, 0.5, &mut vec![0f32; rows], 0)
            .is_err());
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let (vocab, k, rows) = (40, 4096, 2);
        let q = vec![-127i8; vocab * k];
        let y = vec![127i16; rows * k];
        let head = Int8Head::new(&q, &vec![1.0; vocab], vocab, k).unwrap();
        let mut maxima = vec![0f32; head.tiles() * rows];
        head.tile_max(&y, rows, 1.0, &mut maxima, 2).unwrap();
        assert_eq!(maxima, vec![-(127.0 * 127.0 * 4096.0); rows]);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let q = vec![1i8; 20];
        assert!(Int8Head::new(&q, &[1.0; 4], 4, 4).is_err()); // 16 values wanted
        assert!(Int8Head::new(&[i8::MIN; 4], &[1.0], 1, 4).is_err());
        assert!(Int8Head::new(&[1; 4], &[f32::NAN], 1, 4).is_err());
        assert!(Int8Head::new(&[], &[], 0, 4).is_err());
        let head = Int8Head::new(&q[..16], &[1.0; 4], 4, 4).unwrap();
        let mut out = vec![0f32; 2];
        assert!(head.tile_max(&[1; 7], 2, 1.0, &mut out, 1).is_err()); // 8 values wanted
        assert!(head.tile_max(&[-128; 8], 2, 1.0, &mut out, 1).is_err());
        assert!(head
            .tile_max(&[1; 8], 2, f32::INFINITY, &mut out, 1)
            .is_err());
        assert!(head.tile_max(&[1; 8], 2, 1.0, &mut out[..1], 1).is_err());
        assert!(head.tile_max(&[1; 8], 2, 1.0, &mut out, 0).is_ok()); // 0 threads: 1
        let mut vals = vec![0f32; TILE];
        assert!(head
            .tile_values(&[1; 8], 2, 1.0, &[2], &[0], &mut vals)
            .is_err()); // row 2 of 2
        assert!(head
            .tile_values(&[1; 8], 2, 1.0, &[0], &[1], &mut vals)
            .is_err()); // 1 tile
        assert!(head
            .tile_values(&[1; 8], 2, 1.0, &[0, 1], &[0], &mut vals)
            .is_err());
    }
}
