//! Tuning knobs read from the environment: sizes with binary suffixes and
//! bounded counts, each read once per process.
//!
//! Knobs change speed, never results; a value that does not parse or lies
//! outside its range is reported once (a `tracing` warning naming the
//! variable, what it expects and what it found) and the default is used.
//! Setting that must fail loudly instead (because ranks would disagree)
//! is checked where it is used.

use std::ops::RangeInclusive;

/// Parses `8`, `64K`, `16M`, `1G` (binary multiples; `k`, `m`, `g` too).
///
/// ```
/// use tensorcomm::tuning::parse_size;
/// assert_eq!(parse_size("64K"), Some(64 << 10));
/// assert_eq!(parse_size(" 2m "), Some(2 << 20));
/// assert_eq!(parse_size("12"), Some(12));
/// assert_eq!(parse_size("1.5M"), None);
/// ```
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (digits, shift) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 10),
        'M' => (&s[..s.len() - 1], 20),
        'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    digits.trim().parse::<usize>().ok()?.checked_mul(1 << shift)
}

/// The size in environment variable `var` if set and within `range`;
/// `None` if unset, or (with a warning) if malformed or out of range.
pub fn env_size(var: &str, range: RangeInclusive<usize>) -> Option<usize> {
    let raw = std::env::var(var).ok()?;
    let found = parse_size(&raw).filter(|n| range.contains(n));
    if found.is_none() {
        tracing::warn!(
            variable = var,
            value = %raw,
            "expected a size from {} to {} bytes (suffixes K, M, G); ignored",
            range.start(),
            range.end()
        );
    }
    found
}

/// The count in environment variable `var` if set and within `range`;
/// `None` if unset, or (with a warning) if malformed or out of range.
pub fn env_count(var: &str, range: RangeInclusive<usize>) -> Option<usize> {
    let raw = std::env::var(var).ok()?;
    let found = raw
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|n| range.contains(n));
    if found.is_none() {
        tracing::warn!(
            variable = var,
            value = %raw,
            "expected a number from {} to {}; ignored",
            range.start(),
            range.end()
        );
    }
    found
}
