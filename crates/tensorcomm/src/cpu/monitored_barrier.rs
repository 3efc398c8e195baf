//! `monitored_barrier`: a barrier that names the ranks that did not come.
//!
//! Every other rank tells rank 0 it arrived (a point-to-point message on
//! the barrier channel, tagged with the barrier's number); rank 0 waits for
//! each of them until the deadline, then sends every other rank a release:
//! empty when all arrived, or the list of ranks that did not, so that the
//! ranks that did arrive fail with the same names instead of waiting out
//! their own timeout. With `wait_all` rank 0 waits for every rank and names
//! all the missing ones; without it, it stops at the lowest rank known to
//! be missing and names that one.
//!
//! The other ranks wait up to twice the timeout for rank 0's verdict: rank
//! 0 gives it at most one timeout after it arrives, and may itself arrive
//! up to one timeout after them. A rank that hears nothing in that time
//! names rank 0.

use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use super::p2p::{Channel, Message, P2p};
use crate::{Error, Result};

/// Runs barrier number `tag` of the group; `timeout` is what errors report.
pub(crate) fn monitored_barrier(
    p2p: &P2p,
    tag: u64,
    wait_all: bool,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    if p2p.world_size() == 1 {
        return Ok(());
    }
    if p2p.rank() != 0 {
        let (tx, rx) = channel();
        p2p.post(
            Some(0),
            Channel::BarrierRelease,
            tag,
            timeout.saturating_mul(2),
            Box::new(move |m| {
                let _ = tx.send(m);
            }),
        );
        p2p.write(0, Channel::BarrierArrive, tag, &[], deadline)?;
        // The mailbox answers every posted receive: a message, a closed
        // connection, or the deadline.
        let release = rx.recv().map_err(|_| Error::PeerClosed {
            peer: 0,
            during: "waiting for the monitored barrier's release".into(),
            reason: "the point-to-point receiver stopped".into(),
        })??;
        return match decode_missing(&release)? {
            missing if missing.is_empty() => Ok(()),
            missing => Err(Error::RanksMissing { missing, timeout }),
        };
    }
    let (tx, rx) = channel();
    for peer in 1..p2p.world_size() {
        let tx = tx.clone();
        p2p.post(
            Some(peer),
            Channel::BarrierArrive,
            tag,
            timeout,
            Box::new(move |m| {
                let _ = tx.send((peer, m.is_ok()));
            }),
        );
    }
    drop(tx);
    let mut arrived = vec![None; p2p.world_size()];
    arrived[0] = Some(true);
    for (peer, ok) in rx.iter() {
        arrived[peer] = Some(ok);
        let first_missing = arrived.iter().position(|a| *a != Some(true));
        let settled = first_missing.is_some_and(|r| arrived[r] == Some(false));
        if settled && !wait_all {
            break;
        }
    }
    let missing: Vec<usize> = (1..arrived.len())
        .filter(|&r| arrived[r] != Some(true))
        .take(if wait_all { usize::MAX } else { 1 })
        .collect();
    let release: Vec<u8> = missing
        .iter()
        .flat_map(|&r| (r as u64).to_le_bytes())
        .collect();
    let release_deadline = Instant::now() + timeout;
    let mut failed_release = None;
    for peer in 1..p2p.world_size() {
        let sent = p2p.write(
            peer,
            Channel::BarrierRelease,
            tag,
            &release,
            release_deadline,
        );
        // A rank that is missing may be gone: its release cannot arrive.
        if let Err(e) = sent {
            if !missing.contains(&peer) && failed_release.is_none() {
                failed_release = Some(e);
            }
        }
    }
    if !missing.is_empty() {
        return Err(Error::RanksMissing { missing, timeout });
    }
    failed_release.map_or(Ok(()), Err)
}

fn decode_missing(release: &Message) -> Result<Vec<usize>> {
    if !release.payload.len().is_multiple_of(8) {
        return Err(Error::PeerProtocol {
            peer: release.src,
            expected: "a monitored barrier release of 8-byte rank numbers".into(),
            found: format!("{} bytes", release.payload.len()),
        });
    }
    Ok(release
        .payload
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b) as usize
        })
        .collect())
}
