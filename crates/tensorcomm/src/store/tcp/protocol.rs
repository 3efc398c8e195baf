//! The TCP store's wire format: handshake, frames, requests and replies.
//!
//! All integers are little-endian.
//!
//! **Handshake.** The client opens with a fixed-layout hello:
//! `magic [8] = "TCMSTORE" | version u32 | flags u32 | token_len u32 | token`.
//! The server answers `magic [8] | version u32 | status u8 | reason_len u32 |
//! reason`, with status 0 (accepted) or 1 (refused, `reason` says why) and
//! closes the connection after a refusal. Flag bit 0 ([`FLAG_JOIN`]) asks the
//! server to count this connection as a newly joined client; a client sets it
//! on its first connection only, so reconnects and extra connections of one
//! client are not counted twice.
//!
//! **Frames.** After the handshake every request and every reply is one
//! frame: `length u64 | body [length]`. A receiver checks `length` against
//! its maximum message size before allocating anything.
//!
//! **Requests.** `opcode u8 | fields`; a blocking request (get, wait,
//! multi_get, queue_pop) starts with `timeout_ms u64` (`u64::MAX`: no limit).
//! Keys and values are `len u64 | bytes` (keys UTF-8); lists are
//! `count u32 | items`. **Replies** are `tag u8 | payload`: a tag for each
//! kind of success payload (nothing, bytes, integer, bool, count, list of
//! values, list of keys) and one for each failure (timed out, not a counter,
//! failed). The server answers every request with exactly one reply, in
//! order, so a connection stays in step even when a wait times out.

use std::time::Duration;

use crate::{Error, Result};

/// First bytes of both halves of the handshake.
pub(crate) const MAGIC: [u8; 8] = *b"TCMSTORE";
/// The protocol version this build speaks.
pub(crate) const VERSION: u32 = 1;
/// Hello flag: count this connection as a newly joined client.
pub(crate) const FLAG_JOIN: u32 = 1;
/// Longest token a server reads.
pub(crate) const MAX_TOKEN_LEN: usize = 4096;
/// Longest refusal reason a client reads.
pub(crate) const MAX_REASON_LEN: usize = 64 * 1024;
/// Bytes of a frame's length prefix.
pub(crate) const FRAME_HEADER: usize = 8;
/// `timeout_ms` meaning "no limit".
const NO_TIMEOUT: u64 = u64::MAX;

/// Handshake status: accepted.
pub(crate) const ACCEPTED: u8 = 0;
/// Handshake status: refused.
pub(crate) const REFUSED: u8 = 1;
/// How a refusal for being at the connection cap starts: the client
/// retries it until its timeout (a connection may free up), unlike a
/// refusal of its token or version.
pub(crate) const BUSY_REASON_PREFIX: &str = "busy: ";

/// The client's hello: magic, version, flags and the token.
pub(crate) fn encode_hello(token: Option<&str>, flags: u32) -> Vec<u8> {
    let token = token.unwrap_or("").as_bytes();
    let mut out = Vec::with_capacity(20 + token.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&len_u32(token.len()).to_le_bytes());
    out.extend_from_slice(token);
    out
}

/// The server's answer to a hello: `Ok(())` accepts, `Err(reason)` refuses.
pub(crate) fn encode_welcome(verdict: Result<(), &str>) -> Vec<u8> {
    let (status, reason) = match verdict {
        Ok(()) => (ACCEPTED, ""),
        Err(reason) => (REFUSED, reason),
    };
    let reason = &reason.as_bytes()[..reason.len().min(MAX_REASON_LEN)];
    let mut out = Vec::with_capacity(17 + reason.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.push(status);
    out.extend_from_slice(&len_u32(reason.len()).to_le_bytes());
    out.extend_from_slice(reason);
    out
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// Starts a frame in `out`: reserves the length prefix.
pub(crate) fn begin_frame(out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&[0; FRAME_HEADER]);
}

/// Finishes the frame begun by [`begin_frame`]: writes the body's length.
pub(crate) fn finish_frame(out: &mut [u8]) {
    let body = (out.len() - FRAME_HEADER) as u64;
    out[..FRAME_HEADER].copy_from_slice(&body.to_le_bytes());
}

/// Encodes a timeout for the wire, rounding up to whole milliseconds.
pub(crate) fn timeout_to_wire(timeout: Duration) -> u64 {
    let ms = timeout.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(NO_TIMEOUT)
}

/// Decodes a wire timeout; `None` means no limit.
pub(crate) fn timeout_from_wire(ms: u64) -> Option<Duration> {
    (ms != NO_TIMEOUT).then(|| Duration::from_millis(ms))
}

/// Request opcodes.
mod op {
    pub const SET: u8 = 1;
    pub const GET: u8 = 2;
    pub const ADD: u8 = 3;
    pub const COMPARE_SET: u8 = 4;
    pub const WAIT: u8 = 5;
    pub const CHECK: u8 = 6;
    pub const DELETE_KEY: u8 = 7;
    pub const NUM_KEYS: u8 = 8;
    pub const APPEND: u8 = 9;
    pub const MULTI_GET: u8 = 10;
    pub const MULTI_SET: u8 = 11;
    pub const LIST_KEYS: u8 = 12;
    pub const QUEUE_PUSH: u8 = 13;
    pub const QUEUE_POP: u8 = 14;
    pub const QUEUE_LEN: u8 = 15;
}

/// One request, borrowing its keys and values (from the caller on the
/// client, from the received frame on the server). A blocking request's
/// `timeout` is `None` for no limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request<'a> {
    Set {
        key: &'a str,
        value: &'a [u8],
    },
    Get {
        key: &'a str,
        timeout: Option<Duration>,
    },
    Add {
        key: &'a str,
        delta: i64,
    },
    CompareSet {
        key: &'a str,
        expected: &'a [u8],
        desired: &'a [u8],
    },
    Wait {
        keys: Vec<&'a str>,
        timeout: Option<Duration>,
    },
    Check {
        keys: Vec<&'a str>,
    },
    DeleteKey {
        key: &'a str,
    },
    NumKeys,
    Append {
        key: &'a str,
        value: &'a [u8],
    },
    MultiGet {
        keys: Vec<&'a str>,
        timeout: Option<Duration>,
    },
    MultiSet {
        keys: Vec<&'a str>,
        values: Vec<&'a [u8]>,
    },
    ListKeys,
    QueuePush {
        key: &'a str,
        value: &'a [u8],
    },
    QueuePop {
        key: &'a str,
        timeout: Option<Duration>,
    },
    QueueLen {
        key: &'a str,
    },
}

impl<'a> Request<'a> {
    /// Whether the server may hold this request until keys appear.
    pub(crate) fn is_blocking(&self) -> bool {
        matches!(
            self,
            Request::Get { .. }
                | Request::Wait { .. }
                | Request::MultiGet { .. }
                | Request::QueuePop { .. }
        )
    }

    /// Appends this request as one frame to `out` (which is cleared first).
    pub(crate) fn encode_frame(&self, out: &mut Vec<u8>) {
        begin_frame(out);
        let mut w = Writer(out);
        match self {
            Request::Set { key, value } => {
                w.u8(op::SET);
                w.bytes(key.as_bytes());
                w.bytes(value);
            }
            Request::Get { key, timeout } => {
                w.u8(op::GET);
                w.timeout(*timeout);
                w.bytes(key.as_bytes());
            }
            Request::Add { key, delta } => {
                w.u8(op::ADD);
                w.bytes(key.as_bytes());
                w.i64(*delta);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                w.u8(op::COMPARE_SET);
                w.bytes(key.as_bytes());
                w.bytes(expected);
                w.bytes(desired);
            }
            Request::Wait { keys, timeout } => {
                w.u8(op::WAIT);
                w.timeout(*timeout);
                w.keys(keys);
            }
            Request::Check { keys } => {
                w.u8(op::CHECK);
                w.keys(keys);
            }
            Request::DeleteKey { key } => {
                w.u8(op::DELETE_KEY);
                w.bytes(key.as_bytes());
            }
            Request::NumKeys => w.u8(op::NUM_KEYS),
            Request::Append { key, value } => {
                w.u8(op::APPEND);
                w.bytes(key.as_bytes());
                w.bytes(value);
            }
            Request::MultiGet { keys, timeout } => {
                w.u8(op::MULTI_GET);
                w.timeout(*timeout);
                w.keys(keys);
            }
            Request::MultiSet { keys, values } => {
                w.u8(op::MULTI_SET);
                w.u32(len_u32(keys.len()));
                for (key, value) in keys.iter().zip(values) {
                    w.bytes(key.as_bytes());
                    w.bytes(value);
                }
            }
            Request::ListKeys => w.u8(op::LIST_KEYS),
            Request::QueuePush { key, value } => {
                w.u8(op::QUEUE_PUSH);
                w.bytes(key.as_bytes());
                w.bytes(value);
            }
            Request::QueuePop { key, timeout } => {
                w.u8(op::QUEUE_POP);
                w.timeout(*timeout);
                w.bytes(key.as_bytes());
            }
            Request::QueueLen { key } => {
                w.u8(op::QUEUE_LEN);
                w.bytes(key.as_bytes());
            }
        }
        finish_frame(out);
    }

    /// Decodes a request frame's body; every byte must belong to the request.
    pub(crate) fn decode(body: &'a [u8]) -> Result<Self> {
        let mut r = Cursor::new(body, "request");
        let opcode = r.u8("opcode")?;
        let request = match opcode {
            op::SET => Request::Set {
                key: r.str("key")?,
                value: r.bytes("value")?,
            },
            op::GET => Request::Get {
                timeout: r.timeout()?,
                key: r.str("key")?,
            },
            op::ADD => Request::Add {
                key: r.str("key")?,
                delta: r.i64("delta")?,
            },
            op::COMPARE_SET => Request::CompareSet {
                key: r.str("key")?,
                expected: r.bytes("expected value")?,
                desired: r.bytes("desired value")?,
            },
            op::WAIT => Request::Wait {
                timeout: r.timeout()?,
                keys: r.keys()?,
            },
            op::CHECK => Request::Check { keys: r.keys()? },
            op::DELETE_KEY => Request::DeleteKey { key: r.str("key")? },
            op::NUM_KEYS => Request::NumKeys,
            op::APPEND => Request::Append {
                key: r.str("key")?,
                value: r.bytes("value")?,
            },
            op::MULTI_GET => Request::MultiGet {
                timeout: r.timeout()?,
                keys: r.keys()?,
            },
            op::MULTI_SET => {
                let count = r.count("multi_set pairs", 16)?;
                let mut keys = Vec::with_capacity(count);
                let mut values = Vec::with_capacity(count);
                for _ in 0..count {
                    keys.push(r.str("key")?);
                    values.push(r.bytes("value")?);
                }
                Request::MultiSet { keys, values }
            }
            op::LIST_KEYS => Request::ListKeys,
            op::QUEUE_PUSH => Request::QueuePush {
                key: r.str("queue name")?,
                value: r.bytes("value")?,
            },
            op::QUEUE_POP => Request::QueuePop {
                timeout: r.timeout()?,
                key: r.str("queue name")?,
            },
            op::QUEUE_LEN => Request::QueueLen {
                key: r.str("queue name")?,
            },
            other => {
                return Err(Error::Protocol {
                    expected: format!("an opcode from {} to {}", op::SET, op::QUEUE_LEN),
                    found: format!("opcode {other}"),
                })
            }
        };
        r.finish()?;
        Ok(request)
    }
}

/// Reply tags.
mod tag {
    pub const DONE: u8 = 0;
    pub const VALUE: u8 = 1;
    pub const INT: u8 = 2;
    pub const BOOL: u8 = 3;
    pub const COUNT: u8 = 4;
    pub const VALUES: u8 = 5;
    pub const KEYS: u8 = 6;
    pub const TIMED_OUT: u8 = 16;
    pub const NOT_A_COUNTER: u8 = 17;
    pub const FAILED: u8 = 18;
}

/// One reply from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Response {
    /// Success without a payload.
    Done,
    /// One value (get, compare_set, queue_pop).
    Value(Vec<u8>),
    /// A counter (add).
    Int(i64),
    /// check, delete_key.
    Bool(bool),
    /// num_keys, queue_len.
    Count(u64),
    /// multi_get.
    Values(Vec<Vec<u8>>),
    /// list_keys.
    Keys(Vec<String>),
    /// A blocking request ran out of time.
    TimedOut,
    /// add found a value that is not an integer.
    NotACounter { key: String, found: String },
    /// The server could not serve the request; it closes the connection.
    Failed(String),
}

impl Response {
    /// A short name of this reply's kind, for error messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Response::Done => "an empty reply",
            Response::Value(_) => "a value",
            Response::Int(_) => "an integer",
            Response::Bool(_) => "a boolean",
            Response::Count(_) => "a count",
            Response::Values(_) => "a list of values",
            Response::Keys(_) => "a list of keys",
            Response::TimedOut => "a timeout",
            Response::NotACounter { .. } => "a not-a-counter error",
            Response::Failed(_) => "a failure",
        }
    }

    /// Appends this reply as one frame to `out` (which is cleared first).
    pub(crate) fn encode_frame(&self, out: &mut Vec<u8>) {
        begin_frame(out);
        let mut w = Writer(out);
        match self {
            Response::Done => w.u8(tag::DONE),
            Response::Value(v) => {
                w.u8(tag::VALUE);
                w.bytes(v);
            }
            Response::Int(i) => {
                w.u8(tag::INT);
                w.i64(*i);
            }
            Response::Bool(b) => {
                w.u8(tag::BOOL);
                w.u8(u8::from(*b));
            }
            Response::Count(n) => {
                w.u8(tag::COUNT);
                w.u64(*n);
            }
            Response::Values(values) => {
                w.u8(tag::VALUES);
                w.u32(len_u32(values.len()));
                values.iter().for_each(|v| w.bytes(v));
            }
            Response::Keys(keys) => {
                w.u8(tag::KEYS);
                w.u32(len_u32(keys.len()));
                keys.iter().for_each(|k| w.bytes(k.as_bytes()));
            }
            Response::TimedOut => w.u8(tag::TIMED_OUT),
            Response::NotACounter { key, found } => {
                w.u8(tag::NOT_A_COUNTER);
                w.bytes(key.as_bytes());
                w.bytes(found.as_bytes());
            }
            Response::Failed(reason) => {
                w.u8(tag::FAILED);
                w.bytes(reason.as_bytes());
            }
        }
        finish_frame(out);
    }

    /// Decodes a reply frame's body.
    pub(crate) fn decode(body: &[u8]) -> Result<Self> {
        let mut r = Cursor::new(body, "reply");
        let response = match r.u8("reply tag")? {
            tag::DONE => Response::Done,
            tag::VALUE => Response::Value(r.bytes("value")?.to_vec()),
            tag::INT => Response::Int(r.i64("integer")?),
            tag::BOOL => match r.u8("boolean")? {
                0 => Response::Bool(false),
                1 => Response::Bool(true),
                other => {
                    return Err(Error::Protocol {
                        expected: "a boolean 0 or 1".into(),
                        found: other.to_string(),
                    })
                }
            },
            tag::COUNT => Response::Count(r.u64("count")?),
            tag::VALUES => {
                let count = r.count("values", 8)?;
                let mut values = Vec::with_capacity(count);
                for _ in 0..count {
                    values.push(r.bytes("value")?.to_vec());
                }
                Response::Values(values)
            }
            tag::KEYS => {
                let count = r.count("keys", 8)?;
                let mut keys = Vec::with_capacity(count);
                for _ in 0..count {
                    keys.push(r.str("key")?.to_string());
                }
                Response::Keys(keys)
            }
            tag::TIMED_OUT => Response::TimedOut,
            tag::NOT_A_COUNTER => Response::NotACounter {
                key: r.str("key")?.to_string(),
                found: r.str("found value")?.to_string(),
            },
            tag::FAILED => Response::Failed(r.str("reason")?.to_string()),
            other => {
                return Err(Error::Protocol {
                    expected: "a reply tag".into(),
                    found: format!("tag {other}"),
                })
            }
        };
        r.finish()?;
        Ok(response)
    }
}

/// Appends little-endian fields to a buffer.
struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v);
    }
    fn keys(&mut self, keys: &[&str]) {
        self.u32(len_u32(keys.len()));
        keys.iter().for_each(|k| self.bytes(k.as_bytes()));
    }
    fn timeout(&mut self, timeout: Option<Duration>) {
        self.u64(timeout.map_or(NO_TIMEOUT, timeout_to_wire));
    }
}

/// Reads little-endian fields from a received body, never past its end.
struct Cursor<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Cursor { buf, what }
    }

    fn take(&mut self, n: u64, field: &str) -> Result<&'a [u8]> {
        let have = self.buf.len();
        match usize::try_from(n) {
            Ok(n) if n <= have => {
                let (head, rest) = self.buf.split_at(n);
                self.buf = rest;
                Ok(head)
            }
            _ => Err(Error::Protocol {
                expected: format!("{n} more bytes for the {field} of a {}", self.what),
                found: format!("{have} bytes left in the frame"),
            }),
        }
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N]> {
        let bytes = self.take(N as u64, field)?;
        let mut out = [0; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u8(&mut self, field: &str) -> Result<u8> {
        Ok(self.array::<1>(field)?[0])
    }
    fn u32(&mut self, field: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    fn u64(&mut self, field: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
    fn i64(&mut self, field: &str) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array(field)?))
    }

    fn bytes(&mut self, field: &str) -> Result<&'a [u8]> {
        let len = self.u64(field)?;
        self.take(len, field)
    }

    fn str(&mut self, field: &str) -> Result<&'a str> {
        let bytes = self.bytes(field)?;
        std::str::from_utf8(bytes).map_err(|e| Error::Protocol {
            expected: format!("a UTF-8 {field}"),
            found: format!("invalid UTF-8 ({e})"),
        })
    }

    /// A list length, checked against the bytes left (each item takes at
    /// least `min_item` bytes) so a lying count allocates nothing.
    fn count(&mut self, field: &str, min_item: usize) -> Result<usize> {
        let count = self.u32(field)? as usize;
        let fits = self.buf.len() / min_item;
        if count > fits {
            return Err(Error::Protocol {
                expected: format!("at most {fits} {field} in the rest of the frame"),
                found: format!("a count of {count}"),
            });
        }
        Ok(count)
    }

    fn keys(&mut self) -> Result<Vec<&'a str>> {
        let count = self.count("keys", 8)?;
        let mut keys = Vec::with_capacity(count);
        for _ in 0..count {
            keys.push(self.str("key")?);
        }
        Ok(keys)
    }

    fn timeout(&mut self) -> Result<Option<Duration>> {
        Ok(timeout_from_wire(self.u64("timeout")?))
    }

    fn finish(self) -> Result<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(Error::Protocol {
                expected: format!("the end of the {}", self.what),
                found: format!("{} trailing bytes", self.buf.len()),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(frame: &[u8]) -> &[u8] {
        let len = u64::from_le_bytes(frame[..8].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - FRAME_HEADER);
        &frame[FRAME_HEADER..]
    }

    #[test]
    fn every_request_round_trips() {
        let t = Some(Duration::from_millis(1500));
        let requests = vec![
            Request::Set {
                key: "k",
                value: b"v",
            },
            Request::Get {
                key: "k",
                timeout: t,
            },
            Request::Add {
                key: "c",
                delta: -3,
            },
            Request::CompareSet {
                key: "k",
                expected: b"",
                desired: b"x",
            },
            Request::Wait {
                keys: vec!["a", "b"],
                timeout: None,
            },
            Request::Check { keys: vec![] },
            Request::DeleteKey { key: "k" },
            Request::NumKeys,
            Request::Append {
                key: "k",
                value: b"tail",
            },
            Request::MultiGet {
                keys: vec!["a"],
                timeout: t,
            },
            Request::MultiSet {
                keys: vec!["a", "b"],
                values: vec![b"1", b""],
            },
            Request::ListKeys,
            Request::QueuePush {
                key: "q",
                value: b"e",
            },
            Request::QueuePop {
                key: "q",
                timeout: Some(Duration::ZERO),
            },
            Request::QueueLen { key: "q" },
        ];
        let mut frame = Vec::new();
        for request in requests {
            request.encode_frame(&mut frame);
            assert_eq!(Request::decode(body(&frame)).unwrap(), request);
        }
    }

    #[test]
    fn every_response_round_trips() {
        let responses = vec![
            Response::Done,
            Response::Value(b"v".to_vec()),
            Response::Int(-7),
            Response::Bool(true),
            Response::Count(42),
            Response::Values(vec![b"a".to_vec(), vec![]]),
            Response::Keys(vec!["x".into(), "y".into()]),
            Response::TimedOut,
            Response::NotACounter {
                key: "k".into(),
                found: "abc".into(),
            },
            Response::Failed("bad".into()),
        ];
        let mut frame = Vec::new();
        for response in responses {
            response.encode_frame(&mut frame);
            assert_eq!(Response::decode(body(&frame)).unwrap(), response);
        }
    }

    #[test]
    fn timeouts_round_up_to_milliseconds() {
        assert_eq!(timeout_to_wire(Duration::ZERO), 0);
        assert_eq!(timeout_to_wire(Duration::from_micros(1)), 1);
        assert_eq!(timeout_to_wire(Duration::from_millis(250)), 250);
        assert_eq!(timeout_to_wire(Duration::MAX), NO_TIMEOUT);
        assert_eq!(timeout_from_wire(NO_TIMEOUT), None);
        assert_eq!(timeout_from_wire(5), Some(Duration::from_millis(5)));
    }

    #[test]
    fn unknown_opcode_is_a_protocol_error() {
        let err = Request::decode(&[200]).unwrap_err();
        assert!(err.to_string().contains("opcode 200"), "{err}");
    }

    #[test]
    fn truncated_and_trailing_bytes_are_rejected() {
        let mut frame = Vec::new();
        Request::Set {
            key: "key",
            value: b"value",
        }
        .encode_frame(&mut frame);
        let full = body(&frame).to_vec();
        for cut in 0..full.len() {
            assert!(Request::decode(&full[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = full.clone();
        long.push(0);
        let err = Request::decode(&long).unwrap_err();
        assert!(err.to_string().contains("1 trailing bytes"), "{err}");
    }

    #[test]
    fn lying_lengths_allocate_nothing() {
        // A key claiming u64::MAX bytes, and a list claiming 4 billion keys.
        let mut huge_key = vec![op::SET];
        huge_key.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(Request::decode(&huge_key).is_err());
        let mut huge_list = vec![op::CHECK];
        huge_list.extend_from_slice(&u32::MAX.to_le_bytes());
        let err = Request::decode(&huge_list).unwrap_err();
        assert!(err.to_string().contains("a count of 4294967295"), "{err}");
    }

    #[test]
    fn invalid_utf8_keys_are_rejected() {
        let mut b = vec![op::DELETE_KEY];
        b.extend_from_slice(&2u64.to_le_bytes());
        b.extend_from_slice(&[0xff, 0xfe]);
        let err = Request::decode(&b).unwrap_err();
        assert!(err.to_string().contains("UTF-8"), "{err}");
    }
}
