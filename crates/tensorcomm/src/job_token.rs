//! The job's shared secret (`TENSORCOMM_STORE_TOKEN`), as the CPU
//! transport uses it: a connection proves it knows the token with a tag
//! derived from it (SHA-256 of the token and the connection's identity),
//! so the token itself never crosses a transport connection. The TCP
//! store takes the same secret through
//! [`TcpStoreOptions::token`](crate::store::TcpStoreOptions::token).
//!
//! The token guards against stray and cross-job connections on a trusted
//! network; it is not encryption, and someone who can read the network can
//! read the store's handshake, which carries the token in clear (see the
//! README's Security section).
//!
//! ```
//! use tensorcomm::job_token::JobToken;
//! let token = JobToken::new("s3cret");
//! assert_eq!(token.as_str(), "s3cret");
//! // Never shown in logs.
//! assert!(!format!("{token:?}").contains("s3cret"));
//! assert!(JobToken::from_value(Some(String::new())).is_none());
//! ```

use std::fmt;

use sha2::{Digest, Sha256};

use crate::env_vars::STORE_TOKEN;

/// A job's shared secret; its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct JobToken(String);

impl JobToken {
    /// A token of `secret`.
    pub fn new(secret: impl Into<String>) -> Self {
        JobToken(secret.into())
    }

    /// The token of `$TENSORCOMM_STORE_TOKEN`, if set and not empty.
    pub fn from_env() -> Option<Self> {
        Self::from_value(STORE_TOKEN.get())
    }

    /// A token of `value`, or none when it is unset or empty.
    pub fn from_value(value: Option<String>) -> Option<Self> {
        value.filter(|v| !v.is_empty()).map(JobToken)
    }

    /// The secret.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for JobToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobToken(<redacted>)")
    }
}

/// The 32-byte tag that proves knowledge of `token` (or of having none)
/// for one side of one connection: `context` is everything the tag is
/// bound to (protocol, mesh, world size, rank, role), so a tag taken from
/// one connection does not fit another rank, role or mesh.
pub(crate) fn tag(token: Option<&JobToken>, context: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(b"tensorcomm job token tag v1\0");
    match token {
        Some(t) => {
            hash.update([1u8]);
            hash.update((t.0.len() as u64).to_le_bytes());
            hash.update(t.0.as_bytes());
        }
        None => hash.update([0u8]),
    }
    hash.update(context);
    hash.finalize().into()
}

/// Compares two tags in time independent of where they differ.
pub(crate) fn tags_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_differ_by_token_and_context_and_match_otherwise() {
        let a = JobToken::new("a");
        let b = JobToken::new("b");
        let t = tag(Some(&a), b"ctx");
        assert!(tags_equal(&t, &tag(Some(&a), b"ctx")));
        assert!(!tags_equal(&t, &tag(Some(&b), b"ctx")));
        assert!(!tags_equal(&t, &tag(None, b"ctx")));
        assert!(!tags_equal(&t, &tag(Some(&a), b"ctx2")));
        // The length is hashed: ("ab", "c") is not ("a", "bc").
        assert!(!tags_equal(
            &tag(Some(&JobToken::new("ab")), b"c"),
            &tag(Some(&JobToken::new("a")), b"bc")
        ));
    }
}
