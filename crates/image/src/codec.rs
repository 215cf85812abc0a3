//! Decoding to 8-bit RGB the way OpenCV's `imdecode(IMREAD_COLOR)` does.
//!
//! OpenCV drops an alpha channel without compositing, keeps the high byte of 16-bit samples and
//! replicates grey into three channels; so does [`decode`]. The official's error kinds follow
//! its stages: no bytes -> `EmptyImage`; not one of the four formats -> `UnsupportedMediaType`;
//! an unreadable header -> `Decode`; a header that decodes to nothing -> `EmptyImage` (OpenCV
//! returns an empty matrix, whatever went wrong).

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

use crate::webp;

/// A decoded image: `width * height` RGB triples, row-major.
pub struct Rgb {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

/// Why a decode failed, before the caller attaches the image's location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeFailure {
    Empty,
    UnsupportedMediaType,
    Header,
    TooLarge,
    Body,
}

/// The format a data URL's media type names; `None` for types the official refuses.
pub fn format_of_media_type(media_type: &str) -> Option<ImageFormat> {
    match media_type.to_ascii_lowercase().as_str() {
        "image/png" => Some(ImageFormat::Png),
        "image/jpeg" | "image/jpg" => Some(ImageFormat::Jpeg),
        "image/webp" => Some(ImageFormat::WebP),
        "image/gif" => Some(ImageFormat::Gif),
        _ => None,
    }
}

/// The format of `data` by its magic bytes, when it is one the official accepts. Like the
/// official, a short prefix is enough (`\x89PNG` without the rest of the PNG signature); what
/// follows is the decoder's to judge.
pub fn sniff(data: &[u8]) -> Option<ImageFormat> {
    if data.starts_with(b"\x89PNG") {
        Some(ImageFormat::Png)
    } else if data.starts_with(&[0xff, 0xd8, 0xff]) {
        Some(ImageFormat::Jpeg)
    } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        Some(ImageFormat::Gif)
    } else if data.len() >= 12 && data.starts_with(b"RIFF") && &data[8..12] == b"WEBP" {
        Some(ImageFormat::WebP)
    } else {
        None
    }
}

/// Decodes `data` (the first frame of an animation) to RGB, refusing a side over `max_side`.
/// The bytes decide the format, as in the official: a data URL's media type is only checked to
/// be an image type (`parse_data_url`), never trusted over the bytes.
pub fn decode(data: &[u8], max_side: u32) -> Result<Rgb, DecodeFailure> {
    if data.is_empty() {
        return Err(DecodeFailure::Empty);
    }
    let format = sniff(data).ok_or(DecodeFailure::UnsupportedMediaType)?;
    if format == ImageFormat::WebP {
        // libwebp, as OpenCV: the same pixels as the official, and several times faster than
        // the pure-Rust decoder. Animations, which its simple decoder refuses, fall through to
        // the `image` crate (first frame).
        let (w, h) = webp::dimensions(data).ok_or(DecodeFailure::Header)?;
        if w > max_side || h > max_side {
            return Err(DecodeFailure::TooLarge);
        }
        if let Some(rgb) = webp::decode_rgb(data) {
            return Ok(rgb);
        }
    }
    let mut reader = ImageReader::with_format(Cursor::new(data), format);
    // The side check below is the official's limit; image's own allocation cap (512 MiB) stays as
    // a guard against headers that lie.
    reader.limits(Limits::default());
    let decoder = reader.into_decoder().map_err(|_| DecodeFailure::Header)?;
    let (w, h) = decoder.dimensions();
    if w > max_side || h > max_side {
        return Err(DecodeFailure::TooLarge);
    }
    // The EXIF orientation is not applied: the official keeps the stored orientation.
    let img = DynamicImage::from_decoder(decoder).map_err(|_| DecodeFailure::Body)?;
    if img.width() == 0 || img.height() == 0 {
        return Err(DecodeFailure::Body);
    }
    Ok(to_rgb(img))
}

/// The size `data`'s header declares, without decoding the pixels; `None` when it is not one
/// of the four formats or the header is unreadable.
pub fn header_size(data: &[u8]) -> Option<(u32, u32)> {
    match sniff(data)? {
        ImageFormat::WebP => webp::dimensions(data),
        format => ImageReader::with_format(Cursor::new(data), format)
            .into_dimensions()
            .ok(),
    }
}

fn to_rgb(img: DynamicImage) -> Rgb {
    let (width, height) = (img.width(), img.height());
    let pixels = match img {
        DynamicImage::ImageRgb8(b) => b.into_raw(),
        DynamicImage::ImageLuma8(b) => b.into_raw().iter().flat_map(|&v| [v, v, v]).collect(),
        DynamicImage::ImageLumaA8(b) => b
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| [p[0], p[0], p[0]])
            .collect(),
        DynamicImage::ImageRgba8(b) => b
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        // 16-bit: the high byte, as libpng's strip_16 gives OpenCV.
        DynamicImage::ImageLuma16(b) => b
            .into_raw()
            .iter()
            .flat_map(|&v| [(v >> 8) as u8; 3])
            .collect(),
        DynamicImage::ImageLumaA16(b) => b
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| [(p[0] >> 8) as u8; 3])
            .collect(),
        DynamicImage::ImageRgb16(b) => b.into_raw().iter().map(|&v| (v >> 8) as u8).collect(),
        DynamicImage::ImageRgba16(b) => b
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| [(p[0] >> 8) as u8, (p[1] >> 8) as u8, (p[2] >> 8) as u8])
            .collect(),
        other => other.to_rgb8().into_raw(),
    };
    Rgb {
        width,
        height,
        pixels,
    }
}
