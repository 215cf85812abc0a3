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

extern "C" {
    /// libwebp's `WebPEncode` with its main pass (and analysis) on two threads when
    /// `config.thread_level` is set; the same bytes (csrc/webp_wavefront.c).
    fn deepring_webp_encode(
        config: *const ffi::WebPConfig,
        picture: *mut ffi::WebPPicture,
    ) -> c_int;
    #[cfg(test)]
    fn deepring_webp_encode_one_thread(
        config: *const ffi::WebPConfig,
        picture: *mut ffi::WebPPicture,
    ) -> c_int;
}

/// Encodes RGB pixels as lossy WebP at [`QUALITY`], on two threads when `threaded` (the output
/// is libwebp's either way: `tests::parallel_equals_serial`). `None` when libwebp refuses (a
/// side over 16383 px).
pub fn encode_rgb(pixels: &[u8], width: u32, height: u32, threaded: bool) -> Option<Vec<u8>> {
    encode_with(
        pixels,
        width,
        height,
        QUALITY,
        4,
        threaded.then_some(Encoder::Wavefront),
    )
}

/// Which encode entry runs besides libwebp's own on one thread (`None` in [`encode_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoder {
    /// Ours: the main pass on two threads.
    Wavefront,
    /// Ours on one thread, the wavefront's schedule in raster order.
    #[cfg(test)]
    WavefrontOneThread,
    /// libwebp's own with its analysis on a second thread.
    #[cfg(test)]
    LibwebpThreaded,
}

fn encode_with(
    pixels: &[u8],
    width: u32,
    height: u32,
    quality: f32,
    method: c_int,
    encoder: Option<Encoder>,
) -> Option<Vec<u8>> {
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
            quality,
            version,
        ) == 0
        {
            return None;
        }
        let mut config = config.assume_init();
        config.method = method;
        config.thread_level = c_int::from(encoder.is_some());
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
            ok = match encoder {
                Some(Encoder::Wavefront) => deepring_webp_encode(&config, &mut picture),
                #[cfg(test)]
                Some(Encoder::WavefrontOneThread) => {
                    deepring_webp_encode_one_thread(&config, &mut picture)
                }
                // libwebp's own: one thread (None) or, in tests, its threaded analysis.
                _ => ffi::WebPEncode(&config, &mut picture),
            } != 0;
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

    /// A xorshift stream: the tests' pictures are reproducible without a dependency.
    struct Rng(u32);

    impl Rng {
        fn next(&mut self) -> u32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 17;
            self.0 ^= self.0 << 5;
            self.0
        }
    }

    /// Pictures unlike each other in what the encoder does with them: full-range noise (large
    /// coefficients, Cat5 / Cat6 tokens, intra 4x4 everywhere), faint noise, a smooth gradient,
    /// one colour (intra 16x16, skipped blocks, counters that overflow on large pictures), and
    /// flat rectangles with sharp edges over a gradient (screenshot-like: rows of very
    /// different cost, so the two threads drift against each other).
    fn picture(kind: u32, w: u32, h: u32, seed: u32) -> Vec<u8> {
        let mut rng = Rng(seed | 1);
        let mut px = Vec::with_capacity((w * h * 3) as usize);
        for y in 0..h {
            for x in 0..w {
                for c in 0..3u32 {
                    let g = ((x * (3 + c) + y * (5 - c)) / 7 % 256) as u8;
                    let v = match kind {
                        0 => rng.next() as u8,
                        1 => 100 + (rng.next() % 24) as u8,
                        2 => g,
                        3 => 127,
                        _ => {
                            let cell = ((x / 37) ^ (y / 23)).wrapping_mul(2_654_435_761);
                            if cell % 5 == 0 {
                                (cell >> (8 * c)) as u8 | (0x80 * (x % 3 == 0) as u8)
                            } else {
                                g
                            }
                        }
                    };
                    px.push(v);
                }
            }
        }
        px
    }

    fn same_as_libwebp(kind: u32, w: u32, h: u32, quality: f32, method: c_int) {
        let px = picture(kind, w, h, w * 31 + h);
        let serial = encode_with(&px, w, h, quality, method, None).unwrap();
        let case = format!("kind {kind}, {w}x{h}, q{quality}, m{method}");
        for encoder in [
            Encoder::LibwebpThreaded,
            Encoder::WavefrontOneThread,
            Encoder::Wavefront,
        ] {
            let bytes = encode_with(&px, w, h, quality, method, Some(encoder)).unwrap();
            assert!(bytes == serial, "{case}: {encoder:?} differs from libwebp");
        }
    }

    #[test]
    fn parallel_equals_serial() {
        // Sizes: below the wavefront's minimum, two rows, one to three macroblocks wide (the
        // row above is done before it is two ahead), partial macroblocks, several refreshes of
        // the cost tables within one row (500 wide, 4 high), and the bench's canvases' shapes.
        let sizes = [
            (40, 40),
            (200, 17),
            (16, 1200),
            (30, 900),
            (47, 700),
            (333, 250),
            (8000, 64),
            (1036, 770),
        ];
        for (i, &(w, h)) in sizes.iter().enumerate() {
            for kind in 0..5 {
                same_as_libwebp(kind, w, h, QUALITY, 4);
            }
            // Other settings the wavefront takes: qualities (90 is what preprocessing uses)
            // and the trellis methods.
            same_as_libwebp(i as u32 % 5, w, h, [10.0, 50.0, 75.0, 100.0][i % 4], 4);
            same_as_libwebp((i as u32 + 2) % 5, w, h, QUALITY, [3, 5, 6][i % 3]);
        }
    }

    #[test]
    fn overflowing_statistics_replay_exactly() {
        // 2000x1500 of one colour: the token counters of the most used cells pass 65535 and
        // are halved mid-pass, which only the raster-order replay gets right.
        same_as_libwebp(3, 2000, 1500, QUALITY, 4);
        same_as_libwebp(0, 1200, 900, QUALITY, 4);
    }

    #[test]
    fn repeated_parallel_encodes_agree() {
        // The schedule between the threads varies from run to run; the bytes may not.
        let (w, h) = (700, 500);
        let px = picture(4, w, h, 7);
        let first = encode_rgb(&px, w, h, true).unwrap();
        for _ in 0..12 {
            assert!(encode_rgb(&px, w, h, true).unwrap() == first);
        }
        assert!(encode_rgb(&px, w, h, false).unwrap() == first);
    }

    #[test]
    fn round_trip_keeps_the_size() {
        for (w, h) in [(640, 480), (1036, 770), (28, 2000)] {
            let px = picture(1, w, h, 3);
            let one = encode_rgb(&px, w, h, true).unwrap();
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
