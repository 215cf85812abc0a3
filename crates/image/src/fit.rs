//! The canvas: the patch grid an image is resampled onto, and the image token count it implies.
//!
//! The V4.1 vision tower cuts an image into 14 px patches and merges 3x3 patches into one token;
//! each row of merged tokens ends with a newline token, and the image is bracketed by two more.
//! A canvas of `wp x hp` patches therefore costs `ceil(wp/3) * ceil(hp/3) + ceil(hp/3) + 2`
//! tokens, at most [`MAX_TOKENS`]. The official sizes canvases as follows (recovered by probing
//! the official wheel; tests/recipe/test_images_differential.py checks it against the wheel):
//!
//! * Images under [`MIN_PIXELS`] are scaled up by `b = sqrt(MIN_PIXELS / (w*h))`, each side
//!   floored to whole pixels and then rounded up to whole patches. A thin image whose canvas is
//!   still under `MIN_PIXELS` (short side at most 16 patches) gets its long side lengthened until
//!   it is not; wider images keep the rounded canvas.
//! * Other images round each side up to whole patches.
//! * A canvas over the token budget is shrunk (see [`shrink`]); a shrunk canvas under
//!   `MIN_PIXELS` goes through the first rule once more.
//!
//! Checked against the official's `image_token_adjustment` on 600 000 random sizes (0 px to
//! 2^32-1 px sides): one disagreed. Where the continuous solution of [`shrink`] lands exactly on
//! a whole token row or column (sizes in exact rational ratios), the two float computations can
//! floor to different sides of it (recipe/DEVIATIONS.md).
//!
//! The image itself is then scaled to fit inside the canvas and centred on grey padding
//! ([`Canvas::content`]).

use crate::error::CalcResizeError;

/// Side of a vision patch, in pixels.
pub const PATCH: u32 = 14;
/// Patches merged per token along each axis.
pub const MERGE: u32 = 3;
/// The most tokens one image may take.
pub const MAX_TOKENS: u64 = 1024;
/// Images smaller than this (in pixels) are scaled up to about it: 544 x 544.
pub const MIN_PIXELS: u64 = 544 * 544;
/// A thin image's canvas is lengthened to `MIN_PIXELS` only when its short side has at most this
/// many patches. The official lengthens 16-patch-wide canvases and leaves 26-patch-wide ones; no
/// input size produces a short side in between (every (w, h) under `MIN_PIXELS` was enumerated).
const THIN_SIDE_PATCHES: u64 = 16;
/// WebP cannot encode a side longer than 16383 px, so the official caps canvases at the longest
/// whole-patch side under it (1170 patches, 16380 px) after fitting.
pub const MAX_SIDE_PATCHES: u32 = 16383 / PATCH;

/// A canvas of `wp x hp` patches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Canvas {
    pub wp: u32,
    pub hp: u32,
}

/// Image tokens of a `wp x hp` patch canvas.
pub fn image_tokens(wp: u64, hp: u64) -> u64 {
    let cols = wp.div_ceil(MERGE as u64);
    let rows = hp.div_ceil(MERGE as u64);
    cols * rows + rows + 2
}

impl Canvas {
    pub fn width(self) -> u32 {
        self.wp * PATCH
    }
    pub fn height(self) -> u32 {
        self.hp * PATCH
    }
    pub fn tokens(self) -> u64 {
        image_tokens(self.wp as u64, self.hp as u64)
    }

    /// The canvas of a `w x h` image, before the WebP side cap ([`Canvas::encoded`]); the
    /// official counts an `ImageInfo`'s tokens with this.
    pub fn fit(w: u32, h: u32) -> Result<Canvas, CalcResizeError> {
        Self::fit_shrunk(w, h).map(|(c, _)| c)
    }

    /// The canvas the preprocessor encodes: [`Canvas::fit`], then capped for WebP.
    pub fn encoded(w: u32, h: u32) -> Result<Canvas, CalcResizeError> {
        Self::fit_shrunk(w, h).map(|(c, shrunk)| c.capped(shrunk))
    }

    /// The canvas, and whether the token budget shrank it.
    fn fit_shrunk(w: u32, h: u32) -> Result<(Canvas, bool), CalcResizeError> {
        let err = CalcResizeError {
            width: w,
            height: h,
        };
        let (mut wp, mut hp) = base(w as u64, h as u64);
        let shrunk = image_tokens(wp, hp) > MAX_TOKENS;
        if shrunk {
            (wp, hp) = shrink(w, h).ok_or(err.clone())?;
            // A shrunk canvas can fall under MIN_PIXELS (the floors of a very thin image can
            // lose a whole patch column); the official then scales that canvas up again, and
            // gives up if it no longer fits the budget.
            if wp * hp * PATCH_AREA < MIN_PIXELS {
                (wp, hp) = base(wp * PATCH as u64, hp * PATCH as u64);
            }
            if image_tokens(wp, hp) > MAX_TOKENS {
                return Err(err);
            }
        }
        let to_u32 = |v: u64| u32::try_from(v).map_err(|_| err.clone());
        let canvas = Canvas {
            wp: to_u32(wp)?,
            hp: to_u32(hp)?,
        };
        Ok((canvas, shrunk))
    }

    /// The canvas with its long side capped at [`MAX_SIDE_PATCHES`] (16380 px): the short side
    /// in pixels scaled by the same ratio, rounded to whole pixels (half to even), then up to
    /// whole patches, at least two. A canvas the token budget shrank to exactly
    /// [`MAX_TOKENS`] counts its short side as at least one token column (3 patches) there.
    /// Recovered by probing the official wheel (recipe/DEVIATIONS.md I5): it matched every
    /// one of 1,004 random capped canvases.
    fn capped(self, shrunk: bool) -> Canvas {
        let full = shrunk && self.tokens() == MAX_TOKENS;
        let cap = |long: u32, short: u32| {
            if long <= MAX_SIDE_PATCHES {
                return (long, short);
            }
            let short = if full { short.max(MERGE) } else { short };
            let px = (short as f64 * (MAX_SIDE_PATCHES * PATCH) as f64 / long as f64)
                .round_ties_even() as u32;
            (MAX_SIDE_PATCHES, px.div_ceil(PATCH).max(2))
        };
        if self.wp >= self.hp {
            let (wp, hp) = cap(self.wp, self.hp);
            Canvas { wp, hp }
        } else {
            let (hp, wp) = cap(self.hp, self.wp);
            Canvas { wp, hp }
        }
    }

    /// The size (width, height, left, top) of a `w x h` image scaled to fit inside the canvas,
    /// centred: one side fills the canvas, the other is rounded and padded evenly.
    pub fn content(self, w: u32, h: u32) -> (u32, u32, u32, u32) {
        let (cw, ch) = (self.width(), self.height());
        let s = (cw as f64 / w.max(1) as f64).min(ch as f64 / h.max(1) as f64);
        // Halves round to even, as OpenCV's cvRound (472.5 -> 472).
        let iw = ((w as f64 * s).round_ties_even() as u32).clamp(1, cw.max(1));
        let ih = ((h as f64 * s).round_ties_even() as u32).clamp(1, ch.max(1));
        // The official halves the padding with cvRound too: an odd pad of 2k+1 puts k or k+1
        // pixels first, whichever is even (found by matching its bytes on one-colour images).
        let lead = |pad: u32| {
            let half = pad / 2;
            if pad % 2 == 1 && half % 2 == 1 {
                half + 1
            } else {
                half
            }
        };
        (iw, ih, lead(cw - iw), lead(ch - ih))
    }
}

const PATCH_AREA: u64 = (PATCH * PATCH) as u64;

/// The canvas before the token budget: scaled up to about `MIN_PIXELS` when smaller, else each
/// side rounded up to whole patches.
fn base(w: u64, h: u64) -> (u64, u64) {
    let patch = PATCH as u64;
    let area = w.saturating_mul(h);
    if area == 0 || area >= MIN_PIXELS {
        return (w.div_ceil(patch), h.div_ceil(patch));
    }
    let b = (MIN_PIXELS as f64 / area as f64).sqrt();
    let mut wp = ((w as f64 * b).floor() as u64).div_ceil(patch);
    let mut hp = ((h as f64 * b).floor() as u64).div_ceil(patch);
    if wp * hp * PATCH_AREA < MIN_PIXELS && wp.min(hp) <= THIN_SIDE_PATCHES {
        if hp >= wp {
            hp = MIN_PIXELS.div_ceil(wp.max(1) * PATCH_AREA);
        } else {
            wp = MIN_PIXELS.div_ceil(hp.max(1) * PATCH_AREA);
        }
    }
    (wp, hp)
}

/// Shrinks an image over the token budget, as the official does (recovered by probing; it
/// matched the official on every probed size, see the module docs):
///
/// 1. `x`: the scale at which the continuous token count `(w·x/42)·(h·x/42) + h·x/42` meets
///    the budget less the two bracket tokens.
/// 2. Whole token columns and rows at that scale, floored (at least one each; a one-row or
///    one-column image takes the rest of the budget on the other axis).
/// 3. The scale at which the image fits inside those columns and rows, and the patch grid at
///    it, floored. The float arithmetic is kept in the official's order: at a row boundary
///    `h·(rows·42/h)/14` lands a hair under a whole number, and the official's canvas is one
///    patch shorter there; ours must be too.
fn shrink(w: u32, h: u32) -> Option<(u64, u64)> {
    let budget = (MAX_TOKENS - 2) as f64;
    let unit = (PATCH * MERGE) as f64;
    let (wf, hf) = (w as f64, h as f64);
    let (a, b) = (wf / unit, hf / unit);
    let x = (-b + (b * b + 4.0 * a * b * budget).sqrt()) / (2.0 * a * b);
    if !x.is_finite() || x <= 0.0 {
        return None;
    }
    let mut cols = ((wf * x / unit).floor() as u64).max(1);
    let mut rows = ((hf * x / unit).floor() as u64).max(1);
    let budget = MAX_TOKENS - 2;
    if (cols + 1) * rows > budget {
        if rows == 1 {
            cols = budget / rows - 1;
        } else {
            rows = budget / (cols + 1);
        }
    }
    let fit = ((cols * MERGE as u64 * PATCH as u64) as f64 / wf)
        .min((rows * MERGE as u64 * PATCH as u64) as f64 / hf);
    let wp = ((wf * fit / PATCH as f64).floor() as u64).max(1);
    let hp = ((hf * fit / PATCH as f64).floor() as u64).max(1);
    (image_tokens(wp, hp) <= MAX_TOKENS).then_some((wp, hp))
}

/// Prompt tokens beyond one placeholder per image: the official's
/// `MultiModalData.image_token_adjustment`.
pub fn token_adjustment(
    sizes: impl IntoIterator<Item = (u32, u32)>,
) -> Result<u64, CalcResizeError> {
    let mut total = 0u64;
    for (w, h) in sizes {
        total += Canvas::fit(w, h)?.tokens() - 1;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    // (w, h) -> canvas in patches and the official's token adjustment, from the official wheel.
    const CASES: &[(u32, u32, u32, u32, u64)] = &[
        (1, 1, 39, 39, 183),
        (100, 50, 55, 28, 201),
        (640, 480, 46, 35, 205),
        (1024, 768, 74, 55, 495),
        (20, 177, 13, 117, 235),
        (1, 59, 5, 302, 304),
        (26, 4171, 3, 504, 337),
        (140, 78, 52, 29, 191),
        (377, 307, 43, 35, 193),
        (41, 7, 95, 16, 199),
        (28, 16380, 2, 1170, 781),
        (4000, 3000, 108, 81, 1000),
        (1784, 1104, 116, 71, 961),
        (919, 3260, 48, 170, 970),
        // shrunk to 2 x 514 by float floors, then scaled up again
        (158, 27078, 3, 623, 417),
    ];

    #[test]
    fn canvases_match_the_official() {
        for &(w, h, wp, hp, adj) in CASES {
            let c = Canvas::fit(w, h).unwrap();
            assert_eq!((c.wp, c.hp), (wp, hp), "{w}x{h}");
            assert_eq!(c.tokens() - 1, adj, "{w}x{h}");
        }
    }

    #[test]
    fn zero_sizes_count_like_the_official() {
        assert_eq!(token_adjustment([(0, 0)]).unwrap(), 1);
        assert_eq!(token_adjustment([(0, 5)]).unwrap(), 2);
    }

    // (w, h) -> the encoded canvas in patches, from the official wheel: capped for WebP.
    const CAPPED: &[(u32, u32, u32, u32)] = &[
        (1, 907, 2, 1170),
        (1, 1557, 3, 1170),
        (10, 13729, 2, 1170),
        (10, 21394, 3, 1170),
        (35, 24643, 3, 1170),
        (16435, 35, 1170, 3),
        (16791, 2, 1170, 2),
        (19007, 62, 1170, 5),
        (19996, 47, 1170, 4),
        (21966, 89, 1170, 5),
        (23050, 109, 1170, 6),
        (24798, 31, 1170, 2),
        // The cap's short side rounded to whole pixels first (these took a patch more before)
        (30697, 132, 1170, 5),
        (19631, 76, 1170, 5),
        (20342, 63, 1170, 4),
        (33267, 79, 1170, 2),
        (79, 31437, 2, 1170),
        (79, 35533, 2, 1170),
        (60, 30657, 2, 1170),
        // shrunk to exactly the token budget: one token column at least
        (53, 28266, 3, 1170),
        (4, 27891, 3, 1170),
    ];

    #[test]
    fn thin_images_are_capped_for_webp_as_the_official() {
        for &(w, h, wp, hp) in CAPPED {
            let c = Canvas::encoded(w, h).unwrap();
            assert_eq!((c.wp, c.hp), (wp, hp), "{w}x{h}");
            // (each case is capped: its canvas before the cap is longer)
            let uncapped = Canvas::fit(w, h).unwrap();
            assert!(uncapped.wp.max(uncapped.hp) > MAX_SIDE_PATCHES, "{w}x{h}");
        }
        assert!(Canvas::encoded(3000, 1).unwrap().width() <= 16383);
        assert_eq!(
            Canvas::encoded(640, 480).unwrap(),
            Canvas::fit(640, 480).unwrap()
        );
    }

    #[test]
    fn every_canvas_fits_the_budget() {
        for (w, h) in [
            (u32::MAX, u32::MAX),
            (u32::MAX, 1),
            (1, u32::MAX),
            (100_000, 1),
        ] {
            assert!(Canvas::fit(w, h).unwrap().tokens() <= MAX_TOKENS);
        }
    }
}
