//! Striping: a large message to or from a peer is cut into stripes, one
//! per connection to that peer, each moved by a thread of its own.
//!
//! One loopback TCP stream is bounded by the thread copying into and out
//! of the kernel; stripes on several connections, each written and read
//! by its own thread, move in parallel. Both ends compute the stripes from
//! the message's length alone ([`stripe_count`], [`stripe`]), so they
//! agree without a word about it, whichever way each end moves them:
//! through [`HelperThreads`] (all stripes at once) or, when the helpers
//! are busy, one stripe after the other on the calling thread. The
//! one-at-a-time way cannot deadlock against the parallel one: a rank
//! moves stripe `i` only after stripes `0..i`, which its peer drains or
//! fills whichever way it works.

use std::ops::Range;

use super::io::{read_exact, write_all, Context};
use super::Connection;
use crate::cpu::helper_threads::first_error;
use crate::cpu::HelperThreads;
use crate::Result;

/// Messages shorter than this travel whole on the first connection.
pub(super) const STRIPED_MIN_BYTES: usize = 256 << 10;

/// No stripe is made shorter than this.
pub(super) const STRIPE_MIN_BYTES: usize = 64 << 10;

/// How many stripes a message of `len` bytes is cut into over `lanes`
/// connections: one below [`STRIPED_MIN_BYTES`], otherwise one per
/// connection but none under [`STRIPE_MIN_BYTES`].
pub(super) fn stripe_count(len: usize, lanes: usize) -> usize {
    if len < STRIPED_MIN_BYTES {
        1
    } else {
        lanes.min(len / STRIPE_MIN_BYTES).max(1)
    }
}

/// Stripe `i` of `count` of a `len`-byte message.
pub(super) fn stripe(len: usize, count: usize, i: usize) -> Range<usize> {
    i * len / count..(i + 1) * len / count
}

/// One stripe's transfer, for error messages: "sending (stripe 2 of 4)".
fn what(base: &str, i: usize, count: usize) -> String {
    format!("{base} (stripe {} of {count})", i + 1)
}

/// Writes `data` to `peer` in `count` stripes, one per connection.
pub(super) fn send(
    helpers: &HelperThreads,
    out: &[Connection],
    data: &[u8],
    count: usize,
    cx: &Context<'_>,
) -> Result<()> {
    let lane = |i: usize| -> Result<()> {
        let range = stripe(data.len(), count, i);
        let what = what(cx.what, i, count);
        let cx = cx.part(&what, range.len());
        write_all(&mut out[i].writer(), &data[range], &cx)
    };
    match helpers.try_run(count, lane) {
        Some(outcomes) => first_error(outcomes, "send"),
        None => (0..count).try_for_each(lane),
    }
}

/// Reads `buf.len()` bytes from a peer in `count` stripes, one per
/// connection.
pub(super) fn recv(
    helpers: &HelperThreads,
    inp: &[Connection],
    buf: &mut [u8],
    count: usize,
    cx: &Context<'_>,
) -> Result<()> {
    let len = buf.len();
    let parts = split_stripes(buf, count);
    let lane = |i: usize| -> Result<()> {
        let what = what(cx.what, i, count);
        let mut part = lock_part(&parts[i]);
        let cx = cx.part(&what, part.len());
        read_exact(&mut inp[i].reader(), &mut part, &cx)
    };
    debug_assert_eq!(parts.iter().map(|p| lock_part(p).len()).sum::<usize>(), len);
    match helpers.try_run(count, lane) {
        Some(outcomes) => first_error(outcomes, "recv"),
        None => (0..count).try_for_each(lane),
    }
}

/// Writes `data` to one peer and reads `buf` from another (or the same)
/// at once, each in its own number of stripes. With the helpers busy, the
/// stripes are exchanged pairwise in order, `exchange(i)` moving stripe
/// `i` of each direction that has one.
#[allow(clippy::too_many_arguments)]
pub(super) fn send_recv(
    helpers: &HelperThreads,
    out: &[Connection],
    data: &[u8],
    send_count: usize,
    send_cx: &Context<'_>,
    inp: &[Connection],
    buf: &mut [u8],
    recv_count: usize,
    recv_cx: &Context<'_>,
    exchange: impl Fn(usize, &[u8], &mut [u8], &Context<'_>, &Context<'_>) -> Result<()>,
) -> Result<()> {
    let parts = split_stripes(buf, recv_count);
    let lane = |j: usize| -> Result<()> {
        if j < send_count {
            let range = stripe(data.len(), send_count, j);
            let what = what(send_cx.what, j, send_count);
            let cx = send_cx.part(&what, range.len());
            write_all(&mut out[j].writer(), &data[range], &cx)
        } else {
            let i = j - send_count;
            let what = what(recv_cx.what, i, recv_count);
            let mut part = lock_part(&parts[i]);
            let cx = recv_cx.part(&what, part.len());
            read_exact(&mut inp[i].reader(), &mut part, &cx)
        }
    };
    if let Some(outcomes) = helpers.try_run(send_count + recv_count, lane) {
        return first_error(outcomes, "send_recv");
    }
    for i in 0..send_count.max(recv_count) {
        let (sent, send_what) = if i < send_count {
            let range = stripe(data.len(), send_count, i);
            (&data[range], what(send_cx.what, i, send_count))
        } else {
            (&data[..0], send_cx.what.to_string())
        };
        let mut empty = [0u8; 0];
        let mut guard = parts.get(i).map(lock_part);
        let into: &mut [u8] = match guard.as_deref_mut() {
            Some(part) => part,
            None => &mut empty,
        };
        let recv_what = what(recv_cx.what, i, recv_count);
        let scx = send_cx.part(&send_what, sent.len());
        let rcx = recv_cx.part(&recv_what, into.len());
        exchange(i, sent, into, &scx, &rcx)?;
    }
    Ok(())
}

/// `buf` cut into its `count` stripes, each behind a lock so that the
/// lane that owns it can write it through a shared closure.
fn split_stripes(buf: &mut [u8], count: usize) -> Vec<std::sync::Mutex<&mut [u8]>> {
    let len = buf.len();
    let mut parts = Vec::with_capacity(count);
    let mut rest = buf;
    for i in 0..count {
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(stripe(len, count, i).len());
        parts.push(std::sync::Mutex::new(part));
        rest = tail;
    }
    parts
}

fn lock_part<'a, 'b>(
    part: &'a std::sync::Mutex<&'b mut [u8]>,
) -> std::sync::MutexGuard<'a, &'b mut [u8]> {
    part.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_cover_the_message_exactly_and_small_messages_travel_whole() {
        assert_eq!(stripe_count(STRIPED_MIN_BYTES - 1, 4), 1);
        assert_eq!(stripe_count(STRIPED_MIN_BYTES, 4), 4);
        assert_eq!(stripe_count(STRIPED_MIN_BYTES, 8), 4);
        assert_eq!(stripe_count(10 << 20, 3), 3);
        assert_eq!(stripe_count(10 << 20, 1), 1);
        for (len, count) in [(262_144, 4), (1_000_003, 3), (5, 1)] {
            let mut covered = 0;
            for i in 0..count {
                let r = stripe(len, count, i);
                assert_eq!(r.start, covered);
                covered = r.end;
            }
            assert_eq!(covered, len);
        }
    }
}
