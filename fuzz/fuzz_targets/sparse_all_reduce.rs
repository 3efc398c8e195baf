#![no_main]
// The body lives in the library (tensorcomm::fuzz_targets), shared with
// the stable smoke test crates/tensorcomm/tests/fuzz_smoke.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| tensorcomm::fuzz_targets::sparse_all_reduce(data));
