//! Image references in requests: URLs and base64 data URLs, validated as deepseek-recipe does.
//! Images are not fetched or decoded here; a data URL's payload is only checked to be base64.

use std::borrow::Cow;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

use crate::conversation::{ImageData, ImageDetail, ImageSource};

const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Data URL payloads: unused low bits of the last character are tolerated (`QUJ=`), as the
/// official does there (not in Messages sources).
const fn data_url_engine(padding: DecodePaddingMode) -> GeneralPurpose {
    GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(padding),
    )
}
const DATA_URL_PADDED: GeneralPurpose = data_url_engine(DecodePaddingMode::RequireCanonical);
const DATA_URL_UNPADDED: GeneralPurpose = data_url_engine(DecodePaddingMode::RequireNone);

const IMAGE_TYPES: &[&str] = &["png", "jpeg", "jpg", "gif", "webp"];

/// Why a data URL was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataUrlError {
    /// Not `data:...base64,...`.
    NotBase64DataUrl,
    /// The media type is not one of the image types the model takes.
    UnsupportedType,
    /// The payload is not valid base64.
    BadBase64,
}

/// Check `data:<mime>[;params];base64,<payload>`: the header ends at the first `base64,`.
pub(crate) fn check_data_url(url: &str) -> Result<(), DataUrlError> {
    let rest = strip_prefix_ignore_case(url, "data:").ok_or(DataUrlError::NotBase64DataUrl)?;
    let at = rest.find("base64,").ok_or(DataUrlError::NotBase64DataUrl)?;
    let (header, payload) = (&rest[..at], &rest[at + "base64,".len()..]);
    let mime = header
        .split([';', ','])
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let supported = mime
        .strip_prefix("image/")
        .is_some_and(|sub| IMAGE_TYPES.contains(&sub));
    if !supported {
        return Err(DataUrlError::UnsupportedType);
    }
    let compact: Vec<u8> = payload
        .bytes()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    // Padding is either absent or exactly canonical (`QQ` and `QQ==`, not `QQ=`).
    let engine = if compact.ends_with(b"=") {
        &DATA_URL_PADDED
    } else {
        &DATA_URL_UNPADDED
    };
    engine
        .decode(compact)
        .map(|_| ())
        .map_err(|_| DataUrlError::BadBase64)
}

/// A bare base64 payload (Messages image sources) as deepseek-recipe takes it: padding may be
/// over-long (`aGk==`) or short (`QQ=`) but not missing (`aGk`), and only at the end. The
/// payload is decoded and written back in canonical form (standard padding), which is what the
/// data URL then carries; `None` when it does not decode.
pub(crate) fn canonical_bare_base64(data: &str) -> Option<Cow<'_, str>> {
    let body = data.trim_end_matches('=');
    let padded = body.len() < data.len();
    let rem = body.len() % 4;
    if rem == 1 || (rem != 0 && !padded) {
        return None;
    }
    let bytes = BASE64.decode(body).ok()?;
    if rem == 0 && !padded {
        return Some(Cow::Borrowed(data)); // already canonical: no copy of a large payload
    }
    Some(Cow::Owned(
        base64::engine::general_purpose::STANDARD.encode(bytes),
    ))
}

/// An `http://` or `https://` URL.
pub(crate) fn is_web_url(url: &str) -> bool {
    strip_prefix_ignore_case(url, "http://").is_some()
        || strip_prefix_ignore_case(url, "https://").is_some()
}

pub(crate) fn is_http_url(url: &str) -> bool {
    strip_prefix_ignore_case(url, "http").is_some()
}

pub(crate) fn is_data_url(url: &str) -> bool {
    strip_prefix_ignore_case(url, "data:").is_some()
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// What an `image_url` names (an http(s) URL or a valid base64 data URL), or the official's
/// message for one it refuses (Chat and Responses word these alike).
pub(crate) fn url_image_data(url: &str) -> Result<ImageData, &'static str> {
    if is_http_url(url) {
        return Ok(ImageData::Url(url.to_string()));
    }
    if !is_data_url(url) {
        return Err("Unsupported image_url format");
    }
    match check_data_url(url) {
        Ok(()) => Ok(ImageData::DataUrl(url.to_string())),
        Err(DataUrlError::NotBase64DataUrl) => Err("Unsupported image_url format"),
        Err(DataUrlError::UnsupportedType) => Err(UNSUPPORTED_IMAGE),
        Err(DataUrlError::BadBase64) => Err("Invalid base64 data"),
    }
}

pub(crate) fn source(data: ImageData, detail: ImageDetail, path: &str) -> ImageSource {
    ImageSource {
        data,
        detail,
        path: path.to_string(),
    }
}

pub(crate) const UNSUPPORTED_IMAGE: &str = "You have uploaded an unsupported image. Please make sure your image is valid and has one of the following formats: webp, png, jpeg, and gif.";
pub(crate) const UNSUPPORTED_FILE: &str = "You have uploaded an unsupported file. Please make sure your file is valid and has one of the following formats: webp, png, jpeg, and gif.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_base64_is_rewritten_canonically() {
        // What deepseek-recipe 0.2.0 puts in the data URL for each payload (None: an error).
        let cases = [
            ("QUJD", Some("QUJD")),
            ("QUJD====", Some("QUJD")),
            ("QUJD=", Some("QUJD")),
            ("QQ=", Some("QQ==")),
            ("QQ===", Some("QQ==")),
            ("QUI==", Some("QUI=")),
            ("====", Some("")),
            ("=", Some("")),
            ("QQ", None),
            ("Q===", None),
            ("QUJ=", None),
            ("QQ=a", None),
            ("QQ==\n", None),
        ];
        for (data, want) in cases {
            assert_eq!(canonical_bare_base64(data).as_deref(), want, "{data:?}");
        }
    }

    #[test]
    fn data_urls_are_checked_like_the_official() {
        assert_eq!(check_data_url("data:image/png;base64,aGk="), Ok(()));
        assert_eq!(check_data_url("data:image/png;base64,aGk"), Ok(()));
        assert_eq!(check_data_url("data:image/png;base64,QQ"), Ok(()));
        assert_eq!(check_data_url("data:image/png;base64,QQ=="), Ok(()));
        assert_eq!(
            check_data_url("data:image/png;base64,QQ="),
            Err(DataUrlError::BadBase64)
        );
        assert_eq!(
            check_data_url("data:image/png;base64,QUJD=="),
            Err(DataUrlError::BadBase64)
        );
        assert_eq!(check_data_url("data:Image/JPG;x;base64, aG k="), Ok(()));
        assert_eq!(check_data_url("data:image/png,base64,aGk="), Ok(()));
        assert_eq!(
            check_data_url("data:image/png;BASE64,aGk="),
            Err(DataUrlError::NotBase64DataUrl)
        );
        assert_eq!(
            check_data_url("data:text/plain;base64,aGk="),
            Err(DataUrlError::UnsupportedType)
        );
        assert_eq!(
            check_data_url("data:image/png;base64,aGk=="),
            Err(DataUrlError::BadBase64)
        );
        assert_eq!(
            check_data_url("data:image/png;base64,aGk-"),
            Err(DataUrlError::BadBase64)
        );
    }
}
