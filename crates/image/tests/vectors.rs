//! tests/vectors/images.json, recorded from the official wheel: canvas sizes, token counts and
//! errors must match; one-colour sources (`pixel_exact`) must encode to the official's bytes.

use base64::Engine;
use deepring_image::{preprocess, token_adjustment, PreprocessOptions};
use deepring_recipe::ImageDetail;
use serde_json::Value;

fn b64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

#[test]
fn recorded_images() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/vectors/images.json"
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let options = PreprocessOptions {
            detail: ImageDetail::parse(case["detail"].as_str().unwrap()).unwrap(),
            max_dimension_px: case["max_dimension_px"].as_u64().unwrap() as u32,
            low_detail_max_dimension_px: case["low_detail_max_dimension_px"].as_u64().unwrap()
                as u32,
        };
        let got = preprocess(
            &b64(case["source_b64"].as_str().unwrap()),
            options,
            "image[0]",
        );
        let expect = &case["expect"];
        match (got, expect.get("error_kind")) {
            (Ok(info), None) => {
                assert_eq!(
                    info.width as u64,
                    expect["width"].as_u64().unwrap(),
                    "{name}"
                );
                assert_eq!(
                    info.height as u64,
                    expect["height"].as_u64().unwrap(),
                    "{name}"
                );
                let adj = token_adjustment([(info.width, info.height)]).unwrap();
                assert_eq!(adj, expect["token_adjustment"].as_u64().unwrap(), "{name}");
                if case["pixel_exact"].as_bool().unwrap()
                    && info.data != b64(expect["webp_b64"].as_str().unwrap())
                {
                    failures.push(format!("{name}: WebP bytes differ"));
                }
            }
            (Err(e), Some(kind)) => {
                assert_eq!(e.kind(), kind.as_str().unwrap(), "{name}");
                assert_eq!(e.to_string(), expect["error"].as_str().unwrap(), "{name}");
            }
            (got, _) => failures.push(format!(
                "{name}: got {:?}, expected {expect}",
                got.map(|i| (i.width, i.height))
            )),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
