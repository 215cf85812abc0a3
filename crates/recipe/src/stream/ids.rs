//! Tool-call ids and timestamps.
//!
//! deepseek-recipe ids look like `call_00_Ab3…` : the call index as two digits, then 24 random
//! characters whose last 4 are digits. When the model calls a tool without having produced any
//! reasoning text in a thinking-mode response, the id is `call_NN_ET_…` ("empty thinking"): a
//! later request that sends the call back in history can tell that its reasoning was empty.
//! Ids only need to be unique, not unpredictable, so a per-process SplitMix64 stream seeded from
//! the clock and the process id does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static STATE: AtomicU64 = AtomicU64::new(0);

fn next_random() -> u64 {
    let mut seed = STATE.load(Ordering::Relaxed);
    if seed == 0 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9E37_79B9);
        let fresh = nanos ^ (u64::from(std::process::id()) << 32) | 1;
        // Another thread may have seeded it meanwhile; either seed is fine.
        let _ = STATE.compare_exchange(0, fresh, Ordering::Relaxed, Ordering::Relaxed);
    }
    seed = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// `call_NN_[ET_]` + 20 random alphanumerics + 4 random digits.
pub(crate) fn call_id(index: usize, empty_thinking: bool) -> String {
    let mut id = String::with_capacity(36);
    id.push_str("call_");
    id.push_str(&format!("{:02}", index));
    id.push('_');
    if empty_thinking {
        id.push_str("ET_");
    }
    let mut bits = next_random();
    for k in 0..20 {
        if k == 10 {
            bits = next_random();
        }
        id.push(ALNUM[(bits % 62) as usize] as char);
        bits /= 62;
    }
    let digits = next_random() % 10_000;
    id.push_str(&format!("{:04}", digits));
    id
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::call_id;

    #[test]
    fn call_ids_have_the_official_shape() {
        for (index, et) in [(0, false), (7, true), (12, false)] {
            let id = call_id(index, et);
            let prefix = format!("call_{index:02}_{}", if et { "ET_" } else { "" });
            assert!(id.starts_with(&prefix), "{id}");
            let tail = &id[prefix.len()..];
            assert_eq!(tail.len(), 24);
            assert!(tail.bytes().all(|b| b.is_ascii_alphanumeric()));
            assert!(tail[20..].bytes().all(|b| b.is_ascii_digit()));
        }
        assert_ne!(call_id(0, false), call_id(0, false));
    }
}
