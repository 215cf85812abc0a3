#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| deepring_fuzz::stream_processor(data));
