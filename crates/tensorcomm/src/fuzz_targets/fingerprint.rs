//! Collective fingerprints (exchanged between ranks to detect mismatched
//! calls) and failure reports (posted to the store by the rank that found
//! a failure). The first byte picks the decoder. Checked: no panic, a
//! decoded fingerprint encodes back to the same bytes and displays, and a
//! decoded report survives re-encoding and words an error.

use super::input::Input;
use crate::group::failure_report::FailureReport;
use crate::group::fingerprint::{Fingerprint, FINGERPRINT_LEN};

pub fn fingerprint(data: &[u8]) {
    let mut input = Input(data);
    match input.u8() % 2 {
        0 => {
            let mut raw = [0u8; FINGERPRINT_LEN];
            let bytes = input.rest();
            let n = bytes.len().min(FINGERPRINT_LEN);
            raw[..n].copy_from_slice(&bytes[..n]);
            if let Some(fp) = Fingerprint::decode(&raw) {
                assert_eq!(fp.encode(), raw, "{fp:?} re-encodes differently");
                assert!(!fp.to_string().is_empty());
            }
        }
        _ => {
            let bytes = input.rest();
            if let Some(report) = FailureReport::decode(bytes) {
                let encoded = report.encode();
                let again = FailureReport::decode(&encoded)
                    .unwrap_or_else(|| panic!("{report:?} re-encodes to bytes that do not decode"));
                assert_eq!(again.encode(), encoded, "re-encoding is not stable");
                let mine = Fingerprint::decode(&[0; FINGERPRINT_LEN]);
                if let Some(mine) = mine {
                    assert!(!report.to_error(&mine, 0).to_string().is_empty());
                }
            }
        }
    }
}
