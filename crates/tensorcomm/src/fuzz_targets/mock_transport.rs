//! A transport whose peers "send" the fuzz input: every receive takes the
//! next bytes of one shared stream, and fails as a closed peer would when
//! the stream runs out. Sends go nowhere.

use std::sync::Mutex;
use std::time::Instant;

use crate::cpu::transport::Transport;
use crate::{Error, Result};

pub(super) struct StreamTransport<'a> {
    pub(super) rank: usize,
    pub(super) world_size: usize,
    stream: Mutex<&'a [u8]>,
}

impl<'a> StreamTransport<'a> {
    pub(super) fn new(rank: usize, world_size: usize, stream: &'a [u8]) -> Self {
        StreamTransport {
            rank,
            world_size,
            stream: Mutex::new(stream),
        }
    }

    fn take(&self, from: usize, buf: &mut [u8]) -> Result<()> {
        let mut stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        if stream.len() < buf.len() {
            *stream = &[];
            return Err(Error::PeerClosed {
                peer: from,
                during: "a fuzz input".into(),
                reason: "the input ran out".into(),
            });
        }
        let (head, rest) = stream.split_at(buf.len());
        buf.copy_from_slice(head);
        *stream = rest;
        Ok(())
    }
}

impl Transport for StreamTransport<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world_size
    }
    fn send(&self, _to: usize, _data: &[u8], _deadline: Instant) -> Result<()> {
        Ok(())
    }
    fn recv(&self, from: usize, buf: &mut [u8], _deadline: Instant) -> Result<()> {
        self.take(from, buf)
    }
    fn send_recv(
        &self,
        _to: usize,
        _data: &[u8],
        from: usize,
        buf: &mut [u8],
        _deadline: Instant,
    ) -> Result<()> {
        self.take(from, buf)
    }
    fn check_alive(&self, _peer: usize) -> Result<()> {
        Ok(())
    }
    fn has_data(&self, _from: usize) -> Result<bool> {
        Ok(true)
    }
    fn abort(&self) {}
}
