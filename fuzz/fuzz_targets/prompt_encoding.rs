#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| deepring_fuzz::prompt_encoding(data));
