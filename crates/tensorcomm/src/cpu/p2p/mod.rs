//! Point-to-point messages (`send`, `recv`, `recv_any_source`, and the
//! monitored barrier's arrivals and releases) between the ranks of a CPU
//! group.
//!
//! They travel on a mesh of links of their own, set up with the group and
//! routed like the group's collectives (shared memory to ranks on this
//! host, TCP to the others, as the group's transport choice says), so they
//! never interleave with the byte stream of a collective: the collective
//! stream stays strictly ordered and fingerprinted, and a `send` that no
//! one receives yet cannot block or corrupt it. Each message is a
//! [`Header`] (channel, tag, length) and a payload. One reader thread per
//! peer reads every message as it comes and hands it to the [`Mailbox`],
//! which buffers it until a receive with the same channel and tag is
//! posted (so a sender never waits for its receiver to post, and two ranks
//! sending to each other cannot deadlock). An idle reader sleeps in the
//! kernel: on its socket, or on its shared-memory ring's signal (woken by
//! the peer's next write). Sends run in call order on one sender thread
//! per group. A received payload is copied once, into the receiving
//! tensor.
//!
//! Point-to-point calls involve two ranks only, so they take no collective
//! sequence number.

mod mailbox;
pub(crate) mod message;

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

pub(crate) use mailbox::{Deliver, Mailbox, Message};
pub(crate) use message::Channel;
use message::{Header, HEADER_LEN};

use super::transport::{RoutedTransport, RoutedTransportOptions, Transport};
use crate::group::{DeviceEvent, Work};
use crate::store::Store;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Messages up to this size go out in one write with their header.
const COMBINE_MAX: usize = 4 << 10;

/// The least a message's buffer grows by at once.
const READ_CHUNK: usize = 64 << 10;

/// Capacity reserved for a message before its bytes arrive, at most: up
/// to glibc's largest heap allocations (larger ones are mapped, and grow
/// by remapping, without copying), and below the fuzz smoke test's
/// 64 MiB bound on one allocation.
const RESERVE_AHEAD: usize = 32 << 20;

/// How long a reader thread waits for a peer's next message in one call
/// (it simply waits again afterwards): "forever", in practical terms.
const READ_FOREVER: Duration = Duration::from_secs(24 * 3600);

/// The connections and the lock that keeps a header and its payload
/// together on the wire.
struct Link {
    transport: RoutedTransport,
    writing: Mutex<()>,
}

impl Link {
    fn write(
        &self,
        to: usize,
        channel: Channel,
        tag: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<()> {
        let header = Header {
            channel,
            tag,
            len: data.len() as u64,
        }
        .encode();
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        if data.len() <= COMBINE_MAX {
            let mut staged = Vec::with_capacity(HEADER_LEN + data.len());
            staged.extend_from_slice(&header);
            staged.extend_from_slice(data);
            return self.transport.send(to, &staged, deadline);
        }
        self.transport.send(to, &header, deadline)?;
        self.transport.send(to, data, deadline)
    }

    /// Reads `peer`'s messages into `mailbox` until the connection closes.
    fn read_from(&self, peer: usize, mailbox: &Mailbox) {
        let why = read_messages(&self.transport, peer, mailbox);
        tracing::debug!(rank = self.transport.rank(), peer, %why, "p2p connection closed");
        mailbox.close(peer, why);
    }
}

/// Reads `peer`'s messages (header, then payload) from `transport` into
/// `mailbox` until a read fails or a header does not decode; returns why
/// it stopped.
pub(crate) fn read_messages(transport: &dyn Transport, peer: usize, mailbox: &Mailbox) -> String {
    loop {
        let mut header = [0u8; HEADER_LEN];
        if let Err(e) = transport.recv(peer, &mut header, Instant::now() + READ_FOREVER) {
            return e.to_string();
        }
        let header = match Header::decode(&header, peer) {
            Ok(h) => h,
            Err(e) => return e.to_string(),
        };
        let Ok(len) = usize::try_from(header.len) else {
            return format!(
                "rank {peer} announced a message of {} bytes, more than this rank can hold",
                header.len
            );
        };
        // The buffer grows with the bytes that arrive, never to what the
        // header announces before they do: a peer that announces more
        // than it sends costs this rank what it sent. Up to RESERVE_AHEAD
        // the capacity is reserved at once (reserving commits no memory
        // until it is written), so messages up to that size grow in place
        // without reallocating and copying.
        let mut payload = Vec::new();
        if payload.try_reserve_exact(len.min(RESERVE_AHEAD)).is_err() {
            return format!(
                "rank {peer} announced a message of {len} bytes, more than this rank can hold"
            );
        }
        while payload.len() < len {
            let start = payload.len();
            let end = len.min(start.saturating_mul(2).max(READ_CHUNK));
            if payload.capacity() < end && payload.try_reserve_exact(end - start).is_err() {
                return format!(
                    "rank {peer} sent {start} bytes of a message of {len} bytes, more than this \
                     rank can hold"
                );
            }
            payload.resize(end, 0);
            let deadline = Instant::now() + READ_FOREVER;
            if let Err(e) = transport.recv(peer, &mut payload[start..], deadline) {
                return e.to_string();
            }
        }
        mailbox.arrive(peer, header.channel, header.tag, payload);
    }
}

type SendJob = Box<dyn FnOnce() + Send>;

/// Runs on the sender thread before a send reads its tensor (a staged
/// CUDA tensor waits there for its copy to the host).
pub(crate) type BeforeSend = Box<dyn FnOnce() -> Result<()> + Send>;

/// Runs after a receive's message landed in its tensor, on the thread
/// that delivered it (a staged CUDA tensor queues its copy back to the
/// GPU there); the `Work` then completes on the device event it gives.
pub(crate) type AfterRecv = Box<dyn FnOnce() -> Result<Arc<dyn DeviceEvent>> + Send>;

/// One rank's point-to-point side of a group.
pub(crate) struct P2p {
    rank: usize,
    world_size: usize,
    link: Arc<Link>,
    mailbox: Arc<Mailbox>,
    sends: Mutex<Sender<SendJob>>,
}

impl P2p {
    /// Connects to the other ranks under `key_prefix` and starts the
    /// reader, sender and watcher threads.
    pub(crate) fn connect(
        store: &dyn Store,
        key_prefix: &str,
        rank: usize,
        world_size: usize,
        options: &RoutedTransportOptions,
    ) -> Result<Self> {
        let transport = RoutedTransport::connect(store, key_prefix, rank, world_size, options)?;
        let link = Arc::new(Link {
            transport,
            writing: Mutex::new(()),
        });
        let mailbox = Arc::new(Mailbox::new(rank, world_size));
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map(drop)
                .map_err(|e| Error::io("starting a point-to-point thread", e))
        };
        let (sends, jobs) = channel::<SendJob>();
        spawn(
            format!("tensorcomm-p2p-send-rank{rank}"),
            Box::new(move || jobs.into_iter().for_each(|job| job())),
        )?;
        let watched = mailbox.clone();
        spawn(
            format!("tensorcomm-p2p-watch-rank{rank}"),
            Box::new(move || watched.expire_until_shutdown()),
        )?;
        let p2p = P2p {
            rank,
            world_size,
            link,
            mailbox,
            sends: Mutex::new(sends),
        };
        for peer in (0..world_size).filter(|&p| p != rank) {
            let (link, mailbox) = (p2p.link.clone(), p2p.mailbox.clone());
            // On failure `p2p` is dropped, which stops the threads started.
            spawn(
                format!("tensorcomm-p2p-read-rank{rank}-from{peer}"),
                Box::new(move || link.read_from(peer, &mailbox)),
            )?;
        }
        Ok(p2p)
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// How messages to `peer` travel.
    pub(crate) fn route(&self, peer: usize) -> super::transport::Route {
        self.link.transport.route(peer)
    }

    /// How sends and receives blocked on a shared-memory link wait
    /// (`None` without any).
    #[cfg(test)]
    pub(crate) fn shm_wait(&self) -> Option<super::transport::shm::ShmWait> {
        self.link.transport.shm_wait()
    }

    /// Every shared-memory link's peer and how sends and receives blocked
    /// on it wait.
    #[cfg(test)]
    pub(crate) fn shm_link_waits(&self) -> Vec<(usize, super::transport::shm::ShmWait)> {
        self.link.transport.shm_link_waits()
    }

    pub(crate) fn world_size(&self) -> usize {
        self.world_size
    }

    /// Sends `data` to `to` now, on this thread.
    pub(crate) fn write(
        &self,
        to: usize,
        channel: Channel,
        tag: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<()> {
        self.link.write(to, channel, tag, data, deadline)
    }

    /// Queues the bytes of `tensor` to `to` with `tag` on the sender
    /// thread, after `before`, if given.
    pub(crate) fn send(
        &self,
        tensor: Tensor<'static>,
        to: usize,
        tag: u64,
        timeout: Duration,
        before: Option<BeforeSend>,
    ) -> Work {
        let (work, completion) = Work::new();
        let link = self.link.clone();
        let deadline = Instant::now() + timeout;
        let job: SendJob = Box::new(move || {
            let outcome = before.map_or(Ok(()), |before| before()).and_then(|()| {
                tensor
                    .with_bytes(|data| link.write(to, Channel::User, tag, data, deadline))
                    .and_then(|sent| sent)
            });
            completion.complete(outcome);
        });
        let sends = self.sends.lock().unwrap_or_else(PoisonError::into_inner);
        match sends.send(job) {
            Ok(()) => work,
            Err(_) => Work::done(Err(Error::PeerClosed {
                peer: to,
                during: "queueing a send".into(),
                reason: "the group's sender thread has stopped".into(),
            })),
        }
    }

    /// Receives a message with `tag` from `from` (any peer when `None`)
    /// into `tensor`, which must be exactly the message's size, then runs
    /// `after`, if given.
    pub(crate) fn recv(
        &self,
        tensor: Tensor<'static>,
        from: Option<usize>,
        tag: u64,
        timeout: Duration,
        after: Option<AfterRecv>,
    ) -> Work {
        let (work, completion) = Work::new();
        let rank = self.rank;
        let deliver: Deliver = Box::new(move |message: Result<Message>| {
            let landed = message.and_then(|m| copy_into(&tensor, m, rank, tag));
            match (landed, after) {
                (Ok(source), Some(after)) => match after() {
                    Ok(event) => completion.complete_recv_on_device(source, event),
                    Err(e) => completion.complete_recv(Err(e)),
                },
                (landed, _) => completion.complete_recv(landed),
            }
        });
        self.mailbox
            .post(from, Channel::User, tag, timeout, deliver);
        work
    }

    /// Posts a receive whose message (or failure) is handed to `deliver`.
    pub(crate) fn post(
        &self,
        from: Option<usize>,
        channel: Channel,
        tag: u64,
        timeout: Duration,
        deliver: Deliver,
    ) {
        self.mailbox.post(from, channel, tag, timeout, deliver);
    }
}

/// Copies a received message into `tensor`; the sizes must agree.
fn copy_into(tensor: &Tensor<'static>, m: Message, rank: usize, tag: u64) -> Result<usize> {
    tensor.with_bytes_mut(|bytes| {
        if bytes.len() != m.payload.len() {
            return Err(Error::MessageSizeMismatch {
                rank,
                peer: m.src,
                tag,
                expected: bytes.len(),
                found: m.payload.len(),
            });
        }
        bytes.copy_from_slice(&m.payload);
        Ok(m.src)
    })?
}

impl P2p {
    /// Closes the connections to every peer: the reader threads end, and
    /// the peers' waits on this rank fail at once.
    pub(crate) fn abort(&self) {
        self.link.transport.abort();
    }
}

impl Drop for P2p {
    fn drop(&mut self) {
        // Closing the connections ends the reader threads (and tells the
        // peers); the sender thread ends with its queue.
        self.abort();
        self.mailbox.shutdown();
    }
}
