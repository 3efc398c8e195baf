//! The header in front of every point-to-point message: which channel it
//! belongs to (user `send`/`recv` or the monitored barrier), its tag and
//! its length, so the receiving side can buffer it until a receive for the
//! same channel and tag asks for it.

use crate::{Error, Result};

/// Bytes of an encoded [`Header`].
pub(crate) const HEADER_LEN: usize = 24;

const MAGIC: &[u8; 4] = b"TCP2";

/// Which kind of receive a message is meant for; tags of different
/// channels never match each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Channel {
    /// `send` / `recv` / `recv_any_source` of the user.
    User = 0,
    /// A rank telling rank 0 it reached a monitored barrier.
    BarrierArrive = 1,
    /// Rank 0 releasing (or failing) a monitored barrier.
    BarrierRelease = 2,
}

/// What precedes a message's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) channel: Channel,
    pub(crate) tag: u64,
    pub(crate) len: u64,
}

impl Header {
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(MAGIC);
        out[4] = self.channel as u8;
        out[8..16].copy_from_slice(&self.tag.to_le_bytes());
        out[16..24].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Parses the header `peer` sent.
    pub(crate) fn decode(bytes: &[u8; HEADER_LEN], peer: usize) -> Result<Self> {
        let bad = |expected: &str, found: String| Error::PeerProtocol {
            peer,
            expected: expected.into(),
            found,
        };
        if &bytes[0..4] != MAGIC {
            return Err(bad(
                "a point-to-point header starting with \"TCP2\"",
                format!("{:?}", &bytes[0..4]),
            ));
        }
        let channel = match bytes[4] {
            0 => Channel::User,
            1 => Channel::BarrierArrive,
            2 => Channel::BarrierRelease,
            c => return Err(bad("channel 0, 1 or 2", c.to_string())),
        };
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[i..i + 8]);
            u64::from_le_bytes(b)
        };
        Ok(Header {
            channel,
            tag: u64_at(8),
            len: u64_at(16),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_garbage_is_named() {
        let h = Header {
            channel: Channel::BarrierRelease,
            tag: u64::MAX - 3,
            len: 1 << 40,
        };
        assert_eq!(Header::decode(&h.encode(), 2).unwrap(), h);
        let mut bad = h.encode();
        bad[4] = 9;
        let err = Header::decode(&bad, 2).unwrap_err();
        assert!(
            matches!(&err, Error::PeerProtocol { peer: 2, found, .. } if found == "9"),
            "{err:?}"
        );
        bad[0] = b'X';
        let err = Header::decode(&bad, 1).unwrap_err().to_string();
        assert!(err.contains("TCP2"), "{err}");
    }
}
