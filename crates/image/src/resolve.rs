//! A request's image sources -> preprocessed images, under the request's quota.

use base64::Engine;

use deepring_recipe::{ImageData, ImageSource};

use crate::codec;
use crate::error::ImageError;
use crate::fetch::Fetcher;
use crate::preprocess::{cost, preprocess_with, ImageInfo, PreprocessOptions};

/// Encoded bytes a request may carry across all its images: 64 MiB.
pub const MAX_TOTAL_BYTES: usize = 64 * 1024 * 1024;
/// Images a request may carry across all its resolve calls.
pub const MAX_IMAGES: usize = 600;

/// Images and encoded bytes recorded by a request's completed resolve calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImageQuota {
    images: usize,
    bytes: usize,
}

impl ImageQuota {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn image_count(&self) -> usize {
        self.images
    }
    pub fn byte_size(&self) -> usize {
        self.bytes
    }
}

/// The prefix of an image's error messages: `image[i]`, after the source's request path.
fn location(source: &ImageSource, index: usize) -> String {
    if source.path.is_empty() {
        format!("image[{index}]")
    } else {
        format!("{}.image[{index}]", source.path)
    }
}

/// The longest image URL fetched, in bytes (the official's limit).
pub const MAX_URL_BYTES: usize = 8192;

/// Resolves `sources` in order. URL sources are fetched only through `fetcher`; without one a
/// URL source fails as a fetch. The quota is updated only when every source succeeded.
pub fn resolve(
    sources: &[ImageSource],
    quota: &mut ImageQuota,
    fetcher: Option<&Fetcher>,
) -> Result<Vec<ImageInfo>, ImageError> {
    // Checked before any source is read, as the official does.
    let images = quota.images + sources.len();
    if images > MAX_IMAGES {
        return Err(ImageError::TooManyImages {
            max: MAX_IMAGES,
            got: images,
        });
    }
    let mut encoded: Vec<Vec<u8>> = Vec::with_capacity(sources.len());
    let mut bytes = quota.bytes;
    for (i, source) in sources.iter().enumerate() {
        let loc = location(source, i);
        let item = match &source.data {
            ImageData::Bytes(b) => b.clone(),
            ImageData::DataUrl(u) => parse_data_url(u, &loc)?,
            ImageData::Url(u) => {
                // Only a source that does not even start like an http URL is invalid; the
                // official reports anything else that cannot be fetched as a failed download.
                if !u.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("http")) {
                    return Err(ImageError::InvalidUrl(u.clone()));
                }
                // The official refuses a link longer than 8192 bytes of UTF-8 before fetching
                // it, without the source's location in the message.
                if u.len() > MAX_URL_BYTES {
                    return Err(ImageError::UrlTooLong {
                        len: u.len(),
                        max: MAX_URL_BYTES,
                    });
                }
                let fetcher = fetcher.ok_or_else(|| ImageError::Fetch {
                    location: loc.clone(),
                    url: u.clone(),
                })?;
                // Within a request the official reports an over-limit body as a failed download.
                fetcher.fetch(u, &loc).map_err(|e| match e {
                    ImageError::ImageTooLarge { .. } => ImageError::Fetch {
                        location: loc.clone(),
                        url: u.clone(),
                    },
                    other => other,
                })?
            }
        };
        bytes += item.len();
        if bytes > MAX_TOTAL_BYTES {
            return Err(ImageError::TotalSizeTooLarge {
                max_mb: MAX_TOTAL_BYTES / (1024 * 1024),
                got_mb: bytes / (1024 * 1024),
            });
        }
        encoded.push(item);
    }
    let images = preprocess_all(sources, &encoded)?;
    quota.images += sources.len();
    quota.bytes = bytes;
    Ok(images)
}

/// Preprocesses every source, spread over the machine's cores (decode, resample and encode are
/// independent per image; a 10-image request is otherwise ten times one image's latency). An
/// encode takes a second thread only once its worker is the last one running: before that the
/// cores are busy with other images, and two threads each would only contend for them. The
/// largest images go first, so that the last to finish are small (a 10-image request of photos
/// and screenshots otherwise ends on one core with a 12-megapixel JPEG). The error reported is
/// the first source's in request order, as if run one by one.
fn preprocess_all(
    sources: &[ImageSource],
    encoded: &[Vec<u8>],
) -> Result<Vec<ImageInfo>, ImageError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let running = AtomicUsize::new(0);
    let run = |i: usize| {
        let options = PreprocessOptions::for_detail(sources[i].detail);
        let alone = || running.load(Ordering::Acquire) <= 1;
        preprocess_with(&encoded[i], options, &location(&sources[i], i), alone)
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(sources.len());
    if threads <= 1 {
        return (0..sources.len()).map(run).collect();
    }
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_cached_key(|&i| {
        std::cmp::Reverse(cost(
            &encoded[i],
            PreprocessOptions::for_detail(sources[i].detail),
        ))
    });
    running.store(threads, Ordering::Release);
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<Result<ImageInfo, ImageError>>> = vec![None; sources.len()];
    let done: Vec<Vec<(usize, Result<ImageInfo, ImageError>)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            running.fetch_sub(1, Ordering::AcqRel);
                            return mine;
                        };
                        mine.push((i, run(i)));
                    }
                })
            })
            .collect();
        // A worker that panicked yields no results; its sources are reported as resize failures
        // below rather than unwinding into the caller (and across the FFI).
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_default())
            .collect()
    });
    for (i, r) in done.into_iter().flatten() {
        results[i] = Some(r);
    }
    results
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|| Err(ImageError::Resize(location(&sources[i], i)))))
        .collect()
}

/// The bytes of a `data:` URL, read as WHATWG's fetch standard reads them (as the official
/// does): the body is percent-decoded, then base64-decoded forgivingly (ASCII whitespace
/// ignored, padding optional) when the header ends in `;base64`; the media type's essence must
/// be one of the accepted image types (an empty one means `text/plain`) or the source is
/// `UnsupportedMediaType`; anything malformed is `InvalidDataUrl`.
pub fn parse_data_url(url: &str, loc: &str) -> Result<Vec<u8>, ImageError> {
    let invalid = || ImageError::InvalidDataUrl(loc.to_string());
    let url = url.trim_matches(|c: char| c <= ' ');
    let rest = url
        .get(..5)
        .filter(|p| p.eq_ignore_ascii_case("data:"))
        .map(|_| &url[5..])
        .ok_or_else(invalid)?;
    let (header, body) = rest.split_once(',').ok_or_else(invalid)?;
    let mut mime = header.trim_matches(|c: char| c.is_ascii_whitespace());
    let mut base64 = false;
    if let Some(semi) = mime.rfind(';') {
        let tail = mime[semi + 1..].trim_start_matches(' ');
        if tail.eq_ignore_ascii_case("base64") {
            base64 = true;
            mime = &mime[..semi];
        }
    }
    let essence = mime
        .split(';')
        .next()
        .unwrap_or("")
        .trim_matches(|c: char| c.is_ascii_whitespace());
    if codec::format_of_media_type(essence).is_none() {
        return Err(ImageError::UnsupportedMediaType(loc.to_string()));
    }
    // (a `%` not followed by two hex digits stays as it is)
    let bytes: Vec<u8> = percent_encoding::percent_decode(body.as_bytes()).collect();
    if !base64 {
        return Ok(bytes);
    }
    forgiving_base64(&bytes).ok_or_else(invalid)
}

/// WHATWG forgiving-base64 decode: whitespace removed, then one or two `=` of padding allowed
/// only where they complete a quartet, a lone trailing sextet refused.
fn forgiving_base64(b: &[u8]) -> Option<Vec<u8>> {
    let mut data: Vec<u8> = b
        .iter()
        .copied()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    if data.len().is_multiple_of(4) {
        for _ in 0..2 {
            if data.last() == Some(&b'=') {
                data.pop();
            }
        }
    }
    if data.len() % 4 == 1
        || data
            .iter()
            .any(|c| !(c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/'))
    {
        return None;
    }
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(&data)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls() {
        assert_eq!(
            parse_data_url("data:image/png;base64,AAEC", "l").unwrap(),
            vec![0, 1, 2]
        );
        assert_eq!(
            parse_data_url("data:image/png,%89PNG", "l").unwrap(),
            b"\x89PNG".to_vec()
        );
        assert_eq!(
            parse_data_url("data:image/png;base64,AA%45C", "l").unwrap(),
            vec![0, 1, 2]
        );
        assert_eq!(
            parse_data_url("data: image/jpg ;base64, AAE C", "l").unwrap(),
            vec![0, 1, 2]
        );
        assert_eq!(
            parse_data_url("data:image/png;base64,AAE=", "l").unwrap(),
            vec![0, 1]
        );
        assert_eq!(
            parse_data_url("data:image/png;base64,A", "l")
                .unwrap_err()
                .kind(),
            "InvalidDataUrl"
        );
        assert_eq!(
            parse_data_url("data:;base64,AAEC", "l").unwrap_err().kind(),
            "UnsupportedMediaType"
        );
        assert_eq!(
            parse_data_url("data:image/png;base64,!!!!", "l")
                .unwrap_err()
                .kind(),
            "InvalidDataUrl"
        );
        assert_eq!(
            parse_data_url("notadataurl", "l").unwrap_err().kind(),
            "InvalidDataUrl"
        );
        assert_eq!(
            parse_data_url("data:text/plain;base64,AAEC", "l")
                .unwrap_err()
                .kind(),
            "UnsupportedMediaType"
        );
    }

    #[test]
    fn a_failed_call_leaves_the_quota_alone() {
        let mut quota = ImageQuota::new();
        let bad = ImageSource {
            data: ImageData::Bytes(b"xx".to_vec()),
            detail: Default::default(),
            path: "m".into(),
        };
        let err = resolve(&[bad], &mut quota, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("m.image[0]: {}", crate::error::UNSUPPORTED)
        );
        assert_eq!(quota, ImageQuota::new());
    }

    #[test]
    fn at_most_600_images_per_request() {
        let mut quota = ImageQuota {
            images: 599,
            bytes: 0,
        };
        let bad = ImageSource {
            data: ImageData::Bytes(b"xx".to_vec()),
            detail: Default::default(),
            path: String::new(),
        };
        let err = resolve(&[bad.clone(), bad], &mut quota, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Too many images: max 600 images per request, got 601"
        );
    }

    #[test]
    fn links_over_8192_bytes_are_refused_before_any_fetch() {
        let src = |u: String| ImageSource {
            data: ImageData::Url(u),
            detail: Default::default(),
            path: String::new(),
        };
        let base = "http://127.0.0.1:9/";
        // 8192 bytes: fetched (no fetcher here: a fetch failure); 8193: too long.
        let at = src(format!("{base}{}", "a".repeat(8192 - base.len())));
        let over = src(format!("{base}{}", "a".repeat(8193 - base.len())));
        let err = resolve(&[at], &mut ImageQuota::new(), None).unwrap_err();
        assert_eq!(err.kind(), "Fetch");
        let err = resolve(&[over], &mut ImageQuota::new(), None).unwrap_err();
        assert_eq!(err.kind(), "UrlTooLong");
        assert!(!err.is_retryable());
        assert_eq!(
            err.to_string(),
            "external link length 8193 too long, max link length 8192"
        );
        // bytes of UTF-8, not characters
        let wide = src(format!("{base}{}", "\u{e9}".repeat(4100)));
        let err = resolve(&[wide], &mut ImageQuota::new(), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "external link length 8219 too long, max link length 8192"
        );
    }

    #[test]
    fn urls_without_a_fetcher_are_not_fetched() {
        let mut quota = ImageQuota::new();
        let src = ImageSource {
            data: ImageData::Url("http://127.0.0.1:9/a.png".into()),
            detail: Default::default(),
            path: String::new(),
        };
        assert_eq!(
            resolve(&[src], &mut quota, None).unwrap_err().kind(),
            "Fetch"
        );
    }
}
