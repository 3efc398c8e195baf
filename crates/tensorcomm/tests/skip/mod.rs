//! Saying that a test skipped, where a plain `cargo test` shows it: the
//! test harness hides what tests print, so the line goes straight to the
//! process's standard error (a skipped test still counts as passed).
// Each test file uses what it needs.
#![allow(dead_code)]

use std::fmt::Display;
use std::io::Write;

/// Writes `test {test} skipped: {why}` past the harness's capture, as one
/// line (`why`'s line breaks become spaces) in one write: the line
/// `scripts/test.sh` counts (the library's unit tests write the same, from
/// `tensorcomm::test_skipped`). `test` is the test function's name.
pub fn skipped(test: &str, why: impl Display) {
    let why = why.to_string().replace(['\r', '\n'], " ");
    let line = format!("test {test} skipped: {why}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// True when this machine has a GPU; otherwise says why `test` skips.
pub fn has_gpu(test: &str) -> bool {
    match tensorcomm::cuda::runtime::device_count() {
        Ok(0) => skipped(test, "no GPU"),
        Err(e) => skipped(test, e),
        Ok(_) => return true,
    }
    false
}
