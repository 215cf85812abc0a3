//! libwebp (1.6.0, built from source by libwebp-sys): decoding WebP sources and encoding the
//! preprocessed image. The official links the same libwebp through OpenCV, so a WebP source
//! decodes to the same pixels and the same pixels encode to the same bytes.

use std::ffi::c_int;
use std::mem::MaybeUninit;

use libwebp_sys as ffi;

use crate::codec::Rgb;

/// The official's quality (OpenCV `IMWRITE_WEBP_QUALITY` 90), lossy.
pub const QUALITY: f32 = 90.0;

/// The size a WebP header declares; `None` when the header is unreadable.
pub fn dimensions(data: &[u8]) -> Option<(u32, u32)> {
    let (mut w, mut h): (c_int, c_int) = (0, 0);
    // SAFETY: libwebp reads at most `data.len()` bytes of `data` and writes two ints.
    let ok = unsafe { ffi::WebPGetInfo(data.as_ptr(), data.len(), &mut w, &mut h) };
    (ok != 0 && w > 0 && h > 0).then_some((w as u32, h as u32))
}

/// Decodes a still WebP to RGB, dropping alpha without compositing (as OpenCV's colour decode
/// does); `None` when libwebp cannot (animations included).
pub fn decode_rgb(data: &[u8]) -> Option<Rgb> {
    let (mut w, mut h): (c_int, c_int) = (0, 0);
    // SAFETY: as above; on success libwebp returns a buffer of w*h*3 bytes it allocated.
    let out = unsafe { ffi::WebPDecodeRGB(data.as_ptr(), data.len(), &mut w, &mut h) };
    if out.is_null() {
        return None;
    }
    let len = (w as usize) * (h as usize) * 3;
    // SAFETY: `out` holds `len` initialised bytes; it is freed once, by libwebp, after the copy.
    let pixels = unsafe {
        let pixels = std::slice::from_raw_parts(out, len).to_vec();
        ffi::WebPFree(out.cast());
        pixels
    };
    Some(Rgb {
        width: w as u32,
        height: h as u32,
        pixels,
    })
}

/// Encodes RGB pixels as lossy WebP at [`QUALITY`], with the encoder's analysis on a second
/// thread when `threaded` (the output is the same; `tests::threads_do_not_change_the_bytes`).
/// `None` when libwebp refuses (a side over 16383 px).
pub fn encode_rgb(pixels: &[u8], width: u32, height: u32, threaded: bool) -> Option<Vec<u8>> {
    let (w, h) = (c_int::try_from(width).ok()?, c_int::try_from(height).ok()?);
    let stride = w.checked_mul(3)?;
    if pixels.len() != (stride as usize).checked_mul(h as usize)? {
        return None;
    }
    let version = ffi::WEBP_ENCODER_ABI_VERSION as c_int;
    // SAFETY: every struct is initialised by libwebp's own init functions before use; the
    // picture imports from `pixels` (h rows of `stride` bytes, checked above), writes into the
    // memory writer, and both are released exactly once below, whatever the outcome.
    unsafe {
        let mut config = MaybeUninit::<ffi::WebPConfig>::uninit();
        if ffi::WebPConfigInitInternal(
            config.as_mut_ptr(),
            ffi::WebPPreset::WEBP_PRESET_DEFAULT,
            QUALITY,
            version,
        ) == 0
        {
            return None;
        }
        let mut config = config.assume_init();
        config.thread_level = c_int::from(threaded);
        let mut picture = MaybeUninit::<ffi::WebPPicture>::uninit();
        if ffi::WebPPictureInitInternal(picture.as_mut_ptr(), version) == 0 {
            return None;
        }
        let mut picture = picture.assume_init();
        picture.width = w;
        picture.height = h;
        let mut writer = MaybeUninit::<ffi::WebPMemoryWriter>::uninit();
        ffi::WebPMemoryWriterInit(writer.as_mut_ptr());
        let mut writer = writer.assume_init();
        let mut ok = ffi::WebPPictureImportRGB(&mut picture, pixels.as_ptr(), stride) != 0;
        if ok {
            picture.writer = Some(ffi::WebPMemoryWrite);
            picture.custom_ptr = (&mut writer as *mut ffi::WebPMemoryWriter).cast();
            ok = ffi::WebPEncode(&config, &mut picture) != 0;
        }
        let bytes = (ok && !writer.mem.is_null())
            .then(|| std::slice::from_raw_parts(writer.mem, writer.size).to_vec());
        ffi::WebPMemoryWriterClear(&mut writer);
        ffi::WebPPictureFree(&mut picture);
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(w: u32, h: u32) -> Vec<u8> {
        let mut x = 0x2545_f491_u32;
        (0..w * h * 3)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                ((i % 251) ^ (x & 0x3f)) as u8
            })
            .collect()
    }

    #[test]
    fn threads_do_not_change_the_bytes() {
        for (w, h) in [(640, 480), (1036, 770), (28, 2000)] {
            let px = noise(w, h);
            let one = encode_rgb(&px, w, h, false).unwrap();
            assert_eq!(one, encode_rgb(&px, w, h, true).unwrap(), "{w}x{h}");
            let back = decode_rgb(&one).unwrap();
            assert_eq!((back.width, back.height), (w, h));
            assert_eq!(dimensions(&one), Some((w, h)));
        }
    }

    #[test]
    fn webp_side_limit_is_refused_not_panicked() {
        assert!(encode_rgb(&vec![0; 16384 * 3], 16384, 1, true).is_none());
        assert!(encode_rgb(&[0; 5], 1, 1, true).is_none());
        assert!(decode_rgb(b"RIFF\0\0\0\0WEBPVP8 ").is_none());
    }
}
