//! Refusing work that cannot fit in memory before any rank allocates it.
//!
//! A size from the command line reaches `Vec` allocations in every rank;
//! one that cannot fit either overflows (`capacity overflow`), aborts in
//! the allocator or grows until the machine runs out. The commands check a
//! lower bound of what a run needs (all ranks on this host together)
//! against `MemAvailable` in `/proc/meminfo` first, in `u128` so no
//! product overflows.

/// Bytes the kernel says can be allocated without swapping
/// (`MemAvailable`), if `/proc/meminfo` says.
pub fn available() -> Option<u128> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_available(&info)
}

fn parse_available(info: &str) -> Option<u128> {
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// An error naming `what` when `needed` bytes exceed what is available.
/// Without `/proc/meminfo`, only sizes beyond the address space (2^64
/// bytes) are refused.
pub fn check(what: &str, needed: u128, how: &str) -> Result<(), String> {
    let (limit, source) = match available() {
        Some(bytes) => (bytes, "available (MemAvailable in /proc/meminfo)"),
        None => (u128::from(u64::MAX), "addressable"),
    };
    if needed <= limit {
        return Ok(());
    }
    Err(format!(
        "{what} does not fit in memory: it needs at least {} ({how}), expected at most the {} {source}",
        human(needed),
        human(limit)
    ))
}

/// `12.3 GiB`-style.
pub fn human(bytes: u128) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parses_and_sizes_print() {
        let info = "MemTotal:       24000000 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_available(info), Some(2 << 20));
        assert_eq!(parse_available("MemTotal: 1 kB\n"), None);
        assert_eq!(human(8), "8 B");
        assert_eq!(human(3 << 29), "1.5 GiB");
        let err = check("x", u128::MAX, "two copies").unwrap_err();
        assert!(
            err.contains("does not fit in memory") && err.contains("two copies"),
            "{err}"
        );
    }
}
