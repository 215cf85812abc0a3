//! One image: decode, fit the canvas, resample the image into it on grey padding, encode WebP.

use fast_image_resize::images::Image;
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use deepring_recipe::ImageDetail;

use crate::codec::{self, DecodeFailure};
use crate::error::ImageError;
use crate::fit::Canvas;
use crate::webp;

/// The grey OpenCV's `copyMakeBorder` pads the canvas with in the official.
const PAD_VALUE: u8 = 127;

/// Options of one preprocessing call (the official's `PreprocessOptions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreprocessOptions {
    pub detail: ImageDetail,
    /// The longest source side accepted, before any resizing.
    pub max_dimension_px: u32,
    /// At low detail, the long side is first brought down to this.
    pub low_detail_max_dimension_px: u32,
}

impl PreprocessOptions {
    /// What the official's resolver uses for a source of this detail.
    pub fn for_detail(detail: ImageDetail) -> Self {
        PreprocessOptions {
            detail,
            max_dimension_px: 10_000,
            low_detail_max_dimension_px: 512,
        }
    }
}

/// A preprocessed image: encoded WebP bytes and the canvas size in pixels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    pub data: Vec<u8>,
    pub width: u32,
    pub height: u32,
}

/// The size the official brings a low-detail image to before fitting: long side `max`, short
/// side scaled and rounded, at least 1.
pub fn low_detail_size(w: u32, h: u32, max: u32) -> (u32, u32) {
    let long = w.max(h);
    if long <= max || max == 0 {
        return (w, h);
    }
    let scale = |side: u32| ((side as f64 * max as f64 / long as f64).round() as u32).max(1);
    if w >= h {
        (max, scale(h))
    } else {
        (scale(w), max)
    }
}

/// The size a `w` x `h` source is fitted to a canvas at: at low detail first brought down to
/// the options' low-detail side.
fn fitted_size(w: u32, h: u32, options: PreprocessOptions) -> (u32, u32) {
    match options.detail {
        ImageDetail::Low => low_detail_size(w, h, options.low_detail_max_dimension_px),
        _ => (w, h),
    }
}

/// Preprocesses encoded image bytes; `location` is the `...image[i]` prefix of error messages.
/// The encode takes a second thread (webp.rs).
pub fn preprocess(
    data: &[u8],
    options: PreprocessOptions,
    location: &str,
) -> Result<ImageInfo, ImageError> {
    preprocess_with(data, options, location, || true)
}

/// [`preprocess`], asking `threaded` right before the encode whether to take a second thread:
/// callers running several images at once use one per image until a core is free.
pub(crate) fn preprocess_with(
    data: &[u8],
    options: PreprocessOptions,
    location: &str,
    threaded: impl Fn() -> bool,
) -> Result<ImageInfo, ImageError> {
    let loc = || location.to_string();
    let rgb = codec::decode(data, options.max_dimension_px).map_err(|f| match f {
        DecodeFailure::Empty | DecodeFailure::Body => ImageError::EmptyImage(loc()),
        DecodeFailure::UnsupportedMediaType => ImageError::UnsupportedMediaType(loc()),
        DecodeFailure::Header => ImageError::Decode(loc()),
        DecodeFailure::TooLarge => ImageError::ImageDimensionsTooLarge(loc()),
    })?;
    let (w, h) = fitted_size(rgb.width, rgb.height, options);
    let canvas = Canvas::encoded(w, h).map_err(|_| ImageError::Resize(loc()))?;
    let (iw, ih, left, top) = canvas.content(w, h);
    let content = resample(rgb, iw, ih).ok_or_else(|| ImageError::Resize(loc()))?;
    let (cw, ch) = (canvas.width() as usize, canvas.height() as usize);
    let mut pixels = vec![PAD_VALUE; cw * ch * 3];
    let row = iw as usize * 3;
    for y in 0..ih as usize {
        let at = ((top as usize + y) * cw + left as usize) * 3;
        pixels[at..at + row].copy_from_slice(&content[y * row..(y + 1) * row]);
    }
    let data = webp::encode_rgb(&pixels, canvas.width(), canvas.height(), threaded())
        .ok_or_else(|| ImageError::Encode(loc()))?;
    Ok(ImageInfo {
        data,
        width: canvas.width(),
        height: canvas.height(),
    })
}

/// A rough cost of preprocessing `data`, for ordering work: source pixels (decoding) plus the
/// canvas's pixels at the weight of their encoding (~90 ns a pixel against ~7 to decode one, on
/// the 2-core AMD EPYC). 0 when the header is unreadable (the error is found fast).
pub(crate) fn cost(data: &[u8], options: PreprocessOptions) -> u64 {
    let Some((w, h)) = codec::header_size(data) else {
        return 0;
    };
    let (fw, fh) = fitted_size(w, h, options);
    let canvas =
        Canvas::encoded(fw, fh).map_or(0, |c| u64::from(c.width()) * u64::from(c.height()));
    u64::from(w) * u64::from(h) + 13 * canvas
}

/// Bilinear convolution resampling (antialiased when shrinking); the closest of
/// fast_image_resize's filters to the official's output (DEVIATIONS.md).
fn resample(rgb: codec::Rgb, w: u32, h: u32) -> Option<Vec<u8>> {
    if (w, h) == (rgb.width, rgb.height) {
        return Some(rgb.pixels);
    }
    let src = Image::from_vec_u8(rgb.width, rgb.height, rgb.pixels, PixelType::U8x3).ok()?;
    let mut dst = Image::new(w, h, PixelType::U8x3);
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    Resizer::new().resize(&src, &mut dst, &options).ok()?;
    Some(dst.into_vec())
}
