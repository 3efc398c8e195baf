//! Size suffixes (`64K`, `16M`, `1G`). Checked: no panic, and a parsed
//! size is the number written times the suffix's multiple.

use crate::tuning::parse_size;

pub fn size(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Some(n) = parse_size(&text) else {
        return;
    };
    let s = text.trim();
    let shift = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => 10,
        Some('M') => 20,
        Some('G') => 30,
        _ => 0,
    };
    assert_eq!(n % (1usize << shift), 0, "{text:?} gave {n}");
    let digits = if shift == 0 { s } else { &s[..s.len() - 1] };
    let written: usize = digits.trim().parse().expect("a parsed size has digits");
    assert_eq!(Some(n), written.checked_mul(1 << shift), "{text:?}");
}
