//! The fuzz targets as plain tests (stable toolchain, no libFuzzer): each target runs over the
//! regression inputs kept in `tests/vectors/fuzz/<target>/` (every crash a fuzzer found), the local
//! corpus `fuzz/corpus/<target>/` if there is one, and `DEEPRING_FUZZ_ITERATIONS` (default 2000)
//! deterministic pseudo-random inputs.

use std::path::Path;

fn iterations() -> usize {
    std::env::var("DEEPRING_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// xorshift64*: reproducible inputs of varied length, biased towards small byte values so that
/// the `arbitrary` decoders pick short collections and low indices often.
fn inputs(seed: u64) -> impl Iterator<Item = Vec<u8>> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    (0..iterations()).map(move |_| {
        let len = (next() % 512) as usize;
        (0..len)
            .map(|_| {
                let r = next();
                if r % 3 == 0 {
                    (r >> 8) as u8 % 8
                } else {
                    (r >> 16) as u8
                }
            })
            .collect()
    })
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dirs = [
        root.join("../tests/vectors/fuzz").join(target),
        root.join("corpus").join(target),
    ];
    dirs.iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path()).ok())
        .collect()
}

fn run(target: &str, f: fn(&[u8]), seed: u64) {
    for input in corpus(target).into_iter().chain(inputs(seed)) {
        f(&input);
    }
}

#[test]
fn stream_processor() {
    run("stream_processor", deepring_fuzz::stream_processor, 1);
}

#[test]
fn request_json() {
    run("request_json", deepring_fuzz::request_json, 2);
    // JSON text bodies too, not just arbitrary bytes.
    for body in [
        &br#"{"model":"DeepSeek-V4.1-Flash","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}"#[..],
        br#"{"model":"DeepSeek-V4-Pro","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"stream":true}"#,
    ] {
        deepring_fuzz::request_json(body);
    }
}

#[test]
fn prompt_encoding() {
    run("prompt_encoding", deepring_fuzz::prompt_encoding, 3);
}
