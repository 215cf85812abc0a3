//! The GPT-2 byte-level alphabet: every byte maps to one printable character, so BPE vocabularies
//! can be stored as strings. Decoding maps the characters back to bytes.

use std::collections::HashMap;

/// Byte -> character, the table GPT-2 introduced: printable Latin-1 bytes map to themselves, the
/// rest are shifted to code points from U+0100 upwards in byte order.
pub(crate) fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            b as char
        } else {
            let c = char::from_u32(next).unwrap_or('\u{FFFD}');
            next += 1;
            c
        };
    }
    table
}

/// Character -> byte, the inverse of [`byte_to_char`].
pub(crate) fn char_to_byte() -> HashMap<char, u8> {
    byte_to_char()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// The bytes a vocabulary string stands for. A string with a character outside the byte-level
/// alphabet (an added token such as `<｜User｜>`) stands for its own UTF-8 bytes, which is what the
/// Hugging Face byte-level decoder does too.
pub(crate) fn token_bytes(token: &str, map: &HashMap<char, u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(token.len());
    for c in token.chars() {
        match map.get(&c) {
            Some(&b) => out.push(b),
            None => return token.as_bytes().to_vec(),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection() {
        let map = char_to_byte();
        assert_eq!(map.len(), 256);
        assert_eq!(map[&'Ġ'], b' ');
        assert_eq!(map[&'Ċ'], b'\n');
        assert_eq!(map[&'a'], b'a');
    }

    #[test]
    fn added_tokens_decode_to_their_text() {
        let map = char_to_byte();
        assert_eq!(token_bytes("ĠðŁĺ", &map), vec![b' ', 0xF0, 0x9F, 0x98]);
        assert_eq!(token_bytes("<｜User｜>", &map), "<｜User｜>".as_bytes());
        assert_eq!(token_bytes("<think>", &map), b"<think>");
    }
}
