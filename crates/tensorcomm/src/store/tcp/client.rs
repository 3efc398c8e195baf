//! `TcpStore`: a client of a TCP store server.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::at_exit::ExitWait;
use super::own_connections::OwnConnection;
use super::protocol::{
    encode_hello, Request, Response, ACCEPTED, BUSY_REASON_PREFIX, FLAG_JOIN, FRAME_HEADER, MAGIC,
    MAX_REASON_LEN, REFUSED,
};
use super::{reply_grace, TcpStoreOptions, TcpStoreServer};
use crate::store::{check_multi_set, DefaultTimeout, Store};
use crate::{Error, Result};

/// Longest socket timeout set (the OS cannot represent `Duration::MAX`).
const MAX_SOCKET_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);
/// First pause between connection attempts; doubles up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How often a client still trying to reach the store says so (at WARN).
const STILL_TRYING_EVERY: Duration = Duration::from_secs(5);

/// A client of a [`TcpStoreServer`], implementing [`Store`].
///
/// Every call is one round trip: the request carries its timeout to the
/// server, which answers "timed out" when it runs out, so a timed-out client
/// stays usable. If the server dies or hangs, the call fails with
/// [`Error::StoreConnectionLost`] and the next call connects again; a
/// failed call is never retried behind the caller's back. A hung server
/// is declared 5 s past the request's own timeout for a blocking call
/// (`get`, `wait`), and past the store's timeout for any other; within
/// rendezvous and a group's set-up, by that set-up's timeout (see
/// `reply_grace.rs`).
///
/// A `TcpStore` can be shared between threads: each concurrent call uses
/// its own connection (opened on demand, kept for reuse), so one thread
/// waiting for a key never blocks another thread setting it.
///
/// ```
/// use std::{sync::Arc, thread, time::Duration};
/// use tensorcomm::store::{Store, TcpStore, TcpStoreOptions};
///
/// let options = TcpStoreOptions { timeout: Duration::from_secs(10), ..Default::default() };
/// // Rank 0 hosts the server; world size 1: only itself has to join.
/// let rank0 = TcpStore::host("127.0.0.1:0", 1, &options)?;
/// let addr = rank0.server_addr().to_string();
/// let rank1 = Arc::new(TcpStore::connect(&addr, &options)?);
/// let waiter = {
///     let rank1 = rank1.clone();
///     thread::spawn(move || rank1.get("rank0/addr"))
/// };
/// rank0.set("rank0/addr", b"10.0.0.1:4000")?;
/// assert_eq!(waiter.join().unwrap()?, b"10.0.0.1:4000");
/// assert_eq!(rank1.add("arrived", 1)?, 1);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct TcpStore {
    dial: Dial,
    server_addr: SocketAddr,
    max_message_size: usize,
    timeout: DefaultTimeout,
    idle: Mutex<Vec<Connection>>,
    /// The server hosted by [`TcpStore::host`]; declared last so the
    /// client's connections close before it stops.
    server: Option<TcpStoreServer>,
    /// Keeps the hosted server serving other processes' clients while the
    /// process exits without dropping this store (`at_exit.rs`).
    exit_wait: Option<ExitWait>,
    /// How long a hosting store waits for the other clients, when dropped
    /// or when its process exits.
    linger: Duration,
}

impl Drop for TcpStore {
    /// A store hosting the server first closes its own connections, then
    /// waits up to `linger` for every other client to disconnect, so that a
    /// rank finishing just after rank 0 still gets its last replies.
    fn drop(&mut self) {
        let Some(server) = self.server.take() else {
            return;
        };
        self.idle
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        if !server.wait_until_idle(self.linger) {
            tracing::warn!(
                open = server.open_connections(),
                linger = ?self.linger,
                "stopping the store server with clients still connected"
            );
        }
        drop(server);
        // Stopped: an exit from now on has nothing to wait for.
        self.exit_wait.take();
    }
}

impl TcpStore {
    /// Connects to the store server at `addr` ("host:port").
    ///
    /// A server that is not up yet (connection refused, host not resolvable
    /// yet) is retried with backoff until `options.timeout`, then the call
    /// fails with [`Error::StoreConnect`]. A server that refuses this client
    /// (wrong token, other protocol version) fails at once with
    /// [`Error::StoreRefused`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tensorcomm::{Error, store::{TcpStore, TcpStoreOptions, TcpStoreServer}};
    ///
    /// let server = TcpStoreServer::bind(
    ///     "127.0.0.1:0",
    ///     &TcpStoreOptions { token: Some("right".into()), ..Default::default() },
    /// )?;
    /// let addr = server.local_addr().to_string();
    /// let wrong = TcpStoreOptions { token: Some("wrong".into()), ..Default::default() };
    /// let err = TcpStore::connect(&addr, &wrong).unwrap_err();
    /// assert!(matches!(err, Error::StoreRefused { .. }), "{err}");
    /// assert_eq!(server.clients_joined(), 0);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn connect(addr: &str, options: &TcpStoreOptions) -> Result<Self> {
        let dial = Dial {
            addr: addr.to_string(),
            token: options.token.clone(),
            timeout: options.timeout,
            reached: Default::default(),
        };
        let connection = dial.open(true)?;
        Ok(TcpStore {
            server_addr: connection.peer,
            dial,
            max_message_size: options.max_message_size,
            timeout: DefaultTimeout::new(options.timeout),
            idle: Mutex::new(vec![connection]),
            server: None,
            exit_wait: None,
            linger: options.linger,
        })
    }

    /// Starts a server on `addr`, connects to it, and waits until
    /// `world_size` clients (this one included) have joined, or fails with
    /// [`Error::ClientsTimeout`] after `options.timeout`. The server lives
    /// as long as the returned store. This is what rank 0 does.
    ///
    /// Dropping the store waits up to `options.linger` for the other
    /// clients to disconnect before the server stops. So does the process
    /// exiting while the store is still alive (`std::process::exit`, or a
    /// return from `main` with the store held elsewhere): the server keeps
    /// serving other processes' clients until they have disconnected, at
    /// most the linger, so that ranks still reading what this one posted
    /// (a failure report) get it. A process that is killed, or that a
    /// `fork()` without `exec` made, does not wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tensorcomm::{Error, store::{TcpStore, TcpStoreOptions}};
    ///
    /// let options = TcpStoreOptions { timeout: Duration::from_millis(50), ..Default::default() };
    /// let err = TcpStore::host("127.0.0.1:0", 2, &options).unwrap_err();
    /// assert!(err.to_string().contains("1/2 clients joined"), "{err}");
    /// ```
    pub fn host(addr: &str, world_size: usize, options: &TcpStoreOptions) -> Result<Self> {
        if world_size == 0 {
            return Err(Error::BadValue {
                name: "world_size".into(),
                expected: "at least 1 (the hosting rank is one of the world)".into(),
                found: "0".into(),
            });
        }
        let server = TcpStoreServer::bind(addr, options)?;
        let bound = server.local_addr();
        // A server on 0.0.0.0 or [::] is reached through loopback.
        let reach = match bound.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => {
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), bound.port())
            }
            IpAddr::V6(ip) if ip.is_unspecified() => {
                SocketAddr::new(Ipv6Addr::LOCALHOST.into(), bound.port())
            }
            _ => bound,
        };
        let mut store = TcpStore::connect(&reach.to_string(), options)?;
        server.wait_for_clients(world_size, options.timeout)?;
        store.exit_wait = Some(ExitWait::register(&server, options.linger));
        store.server = Some(server);
        Ok(store)
    }

    /// The server's address, as first connected to (with the real port when
    /// the server was hosted on port 0).
    pub fn server_addr(&self) -> SocketAddr {
        self.server_addr
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Connection>> {
        // The pool is a plain Vec: a panic elsewhere cannot corrupt it.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One request, one reply. `wait` is the request's own timeout for
    /// blocking requests, `None` for those the server answers at once;
    /// the reply's grace comes on top.
    fn call(&self, request: &Request<'_>, wait: Option<Duration>) -> Result<Response> {
        let pooled = self.idle().pop();
        let mut connection = match pooled {
            Some(c) => c,
            None => self.dial.open(false)?,
        };
        request.encode_frame(&mut connection.buf);
        let size = connection.buf.len() - FRAME_HEADER;
        if size > self.max_message_size {
            self.idle().push(connection);
            return Err(Error::MessageTooLarge {
                size: size as u64,
                max: self.max_message_size as u64,
            });
        }
        let patience = reply_grace::reply_patience(wait, self.timeout()).min(MAX_SOCKET_TIMEOUT);
        match connection.exchange(patience, self.max_message_size) {
            Ok(response) => {
                // After a failure the server closes the connection.
                if !matches!(response, Response::Failed(_)) {
                    self.idle().push(connection);
                }
                Ok(response)
            }
            Err(Exchange::TooLarge(size)) => Err(Error::MessageTooLarge {
                size,
                max: self.max_message_size as u64,
            }),
            Err(Exchange::Decode(err)) => Err(err),
            Err(Exchange::Io(reason)) => {
                debug!(addr = %self.dial.addr, "store connection lost: {reason}");
                Err(Error::StoreConnectionLost {
                    addr: self.dial.addr.clone(),
                    reason,
                })
            }
        }
    }

    /// The error for a reply that is not the success `expected`.
    fn unexpected(
        &self,
        response: Response,
        expected: &str,
        keys: &[&str],
        timeout: Duration,
    ) -> Error {
        match response {
            Response::TimedOut => Error::StoreTimeout {
                keys: keys.iter().map(|k| k.to_string()).collect(),
                timeout,
            },
            Response::NotACounter { key, found } => Error::NotACounter { key, found },
            Response::Failed(reason) => Error::StoreServer {
                addr: self.dial.addr.clone(),
                reason,
            },
            other => Error::Protocol {
                expected: expected.to_string(),
                found: other.kind().to_string(),
            },
        }
    }

    fn done(&self, request: &Request<'_>, what: &str) -> Result<()> {
        match self.call(request, None)? {
            Response::Done => Ok(()),
            other => Err(self.unexpected(other, what, &[], self.timeout())),
        }
    }

    fn count(&self, request: &Request<'_>, what: &str) -> Result<usize> {
        match self.call(request, None)? {
            Response::Count(n) => usize::try_from(n).map_err(|_| Error::Protocol {
                expected: what.to_string(),
                found: format!("count {n}"),
            }),
            other => Err(self.unexpected(other, what, &[], self.timeout())),
        }
    }

    fn boolean(&self, request: &Request<'_>, what: &str) -> Result<bool> {
        match self.call(request, None)? {
            Response::Bool(b) => Ok(b),
            other => Err(self.unexpected(other, what, &[], self.timeout())),
        }
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.done(&Request::Set { key, value }, "an empty reply to set")
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let request = Request::Get {
            key,
            timeout: Some(timeout),
        };
        match self.call(&request, Some(timeout))? {
            Response::Value(value) => Ok(value),
            other => Err(self.unexpected(other, "a value in reply to get", &[key], timeout)),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        match self.call(&Request::Add { key, delta }, None)? {
            Response::Int(value) => Ok(value),
            other => {
                Err(self.unexpected(other, "an integer in reply to add", &[key], self.timeout()))
            }
        }
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let request = Request::CompareSet {
            key,
            expected,
            desired,
        };
        match self.call(&request, None)? {
            Response::Value(value) => Ok(value),
            other => Err(self.unexpected(
                other,
                "a value in reply to compare_set",
                &[key],
                self.timeout(),
            )),
        }
    }

    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let request = Request::Wait {
            keys: keys.to_vec(),
            timeout: Some(timeout),
        };
        match self.call(&request, Some(timeout))? {
            Response::Done => Ok(()),
            other => Err(self.unexpected(other, "an empty reply to wait", keys, timeout)),
        }
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let request = Request::Check {
            keys: keys.to_vec(),
        };
        self.boolean(&request, "a boolean in reply to check")
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        self.boolean(
            &Request::DeleteKey { key },
            "a boolean in reply to delete_key",
        )
    }

    fn num_keys(&self) -> Result<usize> {
        self.count(&Request::NumKeys, "a count in reply to num_keys")
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.done(&Request::Append { key, value }, "an empty reply to append")
    }

    fn multi_get_timeout(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let request = Request::MultiGet {
            keys: keys.to_vec(),
            timeout: Some(timeout),
        };
        match self.call(&request, Some(timeout))? {
            Response::Values(values) if values.len() == keys.len() => Ok(values),
            Response::Values(values) => Err(Error::Protocol {
                expected: format!("{} values in reply to multi_get", keys.len()),
                found: format!("{} values", values.len()),
            }),
            other => Err(self.unexpected(other, "values in reply to multi_get", keys, timeout)),
        }
    }

    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        check_multi_set(keys, values)?;
        let request = Request::MultiSet {
            keys: keys.to_vec(),
            values: values.to_vec(),
        };
        self.done(&request, "an empty reply to multi_set")
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        match self.call(&Request::ListKeys, None)? {
            Response::Keys(keys) => Ok(keys),
            other => Err(self.unexpected(other, "keys in reply to list_keys", &[], self.timeout())),
        }
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.done(
            &Request::QueuePush { key, value },
            "an empty reply to queue_push",
        )
    }

    fn queue_pop_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let request = Request::QueuePop {
            key,
            timeout: Some(timeout),
        };
        match self.call(&request, Some(timeout))? {
            Response::Value(value) => Ok(value),
            other => Err(self.unexpected(other, "a value in reply to queue_pop", &[key], timeout)),
        }
    }

    fn queue_len(&self, key: &str) -> Result<usize> {
        self.count(&Request::QueueLen { key }, "a count in reply to queue_len")
    }

    fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout)
    }
}

impl fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpStore")
            .field("addr", &self.dial.addr)
            .field("server_addr", &self.server_addr)
            .field("timeout", &self.timeout())
            .field("hosts_server", &self.server.is_some())
            .finish()
    }
}

/// How to reach the server: address, token, and how long to keep trying.
struct Dial {
    addr: String,
    token: Option<String>,
    timeout: Duration,
    /// Set once a connection has been made: a server that then refuses
    /// connections has gone (nothing listens on its port any more), and
    /// retrying until the timeout only delays the error.
    reached: std::sync::atomic::AtomicBool,
}

/// Why one connection attempt failed.
enum Attempt {
    /// Worth trying again (refused, unreachable, closed mid-handshake).
    Retry(String),
    /// Trying again cannot help (refused by the server, not a store).
    Final(Error),
}

impl Dial {
    /// Connects and completes the handshake, retrying with backoff until
    /// the timeout. `join` asks the server to count this client as joined.
    fn open(&self, join: bool) -> Result<Connection> {
        let started = Instant::now();
        // Within a set-up or a background thread, that bounds it too.
        let deadline = reply_grace::dial_deadline(started.checked_add(self.timeout));
        let mut backoff = FIRST_BACKOFF;
        let mut said = started;
        loop {
            let reason = match self.attempt(join, deadline) {
                Ok(connection) => {
                    self.reached
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    return Ok(connection);
                }
                Err(Attempt::Final(err)) => return Err(err),
                Err(Attempt::Retry(reason)) => reason,
            };
            let left = time_left(deadline);
            if left.is_zero() {
                return Err(Error::StoreConnect {
                    addr: self.addr.clone(),
                    timeout: deadline.map_or(self.timeout, |d| d - started),
                    reason,
                });
            }
            if said.elapsed() >= STILL_TRYING_EVERY {
                // Waiting is silent at first (ranks start in any order),
                // then says what it waits for every few seconds.
                said = Instant::now();
                warn!(
                    addr = %self.addr,
                    "still trying to reach the store after {:.0?} (of {:?}): {reason}",
                    started.elapsed(),
                    deadline.map_or(self.timeout, |d| d - started)
                );
            } else {
                debug!(addr = %self.addr, "store not reachable yet ({reason}), retrying");
            }
            thread::sleep(backoff.min(left));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn attempt(&self, join: bool, deadline: Option<Instant>) -> Result<Connection, Attempt> {
        let candidates = match self.addr.to_socket_addrs() {
            Ok(candidates) => candidates,
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                return Err(Attempt::Final(Error::InvalidArgument(format!(
                    "store address {:?}: expected host:port ({e})",
                    self.addr
                ))))
            }
            Err(e) => return Err(Attempt::Retry(format!("could not resolve it: {e}"))),
        };
        let mut last = String::from("it resolved to no address");
        for candidate in candidates {
            let left = time_left(deadline)
                .max(Duration::from_millis(1))
                .min(MAX_SOCKET_TIMEOUT);
            match TcpStream::connect_timeout(&candidate, left) {
                Ok(stream) => {
                    let patience =
                        reply_grace::handshake_patience(time_left(deadline), self.timeout);
                    return self.handshake(stream, candidate, join, patience);
                }
                Err(e)
                    if e.kind() == io::ErrorKind::ConnectionRefused
                        && self.reached.load(std::sync::atomic::Ordering::Relaxed) =>
                {
                    return Err(Attempt::Final(Error::StoreConnectionLost {
                        addr: self.addr.clone(),
                        reason: format!(
                            "{candidate} refused a new connection after earlier ones were accepted: the store server is gone ({e})"
                        ),
                    }))
                }
                Err(e) => last = format!("{candidate}: {e}"),
            }
        }
        Err(Attempt::Retry(last))
    }

    fn handshake(
        &self,
        mut stream: TcpStream,
        peer: SocketAddr,
        join: bool,
        patience: Duration,
    ) -> Result<Connection, Attempt> {
        let retry = |what: &str, e: io::Error| Attempt::Retry(format!("{peer}: {what}: {e}"));
        // Counted as this process's from before the server can see it
        // complete its handshake.
        let own = OwnConnection::new(&stream);
        let setup = stream
            .set_nodelay(true)
            .and_then(|()| stream.set_read_timeout(Some(patience)))
            .and_then(|()| stream.set_write_timeout(Some(patience)));
        setup.map_err(|e| retry("configuring the socket", e))?;
        let flags = if join { FLAG_JOIN } else { 0 };
        stream
            .write_all(&encode_hello(self.token.as_deref(), flags))
            .map_err(|e| retry("sending the hello", e))?;
        let mut head = [0u8; 17];
        stream.read_exact(&mut head).map_err(|e| {
            let unanswered = matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            );
            if unanswered && self.reached.load(std::sync::atomic::Ordering::Relaxed) {
                // It served this client before, took this connection and
                // said nothing for all that time: stopped or hung.
                return Attempt::Final(Error::StoreConnectionLost {
                    addr: self.addr.clone(),
                    reason: format!(
                        "{peer} accepted a new connection but did not answer its handshake \
                         within {patience:?}, after answering earlier ones (is the server hung?)"
                    ),
                });
            }
            retry("reading the handshake reply", e)
        })?;
        if head[..8] != MAGIC {
            return Err(Attempt::Final(Error::Protocol {
                expected: format!(
                    "a tensorcomm store at {} (magic {:?})",
                    self.addr,
                    String::from_utf8_lossy(&MAGIC)
                ),
                found: format!("{:?}", String::from_utf8_lossy(&head[..8])),
            }));
        }
        let status = head[12];
        let reason_len = u32::from_le_bytes([head[13], head[14], head[15], head[16]]) as usize;
        if reason_len > MAX_REASON_LEN {
            return Err(Attempt::Final(Error::Protocol {
                expected: format!("a refusal reason of at most {MAX_REASON_LEN} bytes"),
                found: format!("{reason_len} bytes"),
            }));
        }
        let mut reason = vec![0u8; reason_len];
        stream
            .read_exact(&mut reason)
            .map_err(|e| retry("reading the handshake reply", e))?;
        match status {
            ACCEPTED => Ok(Connection {
                stream,
                peer,
                buf: Vec::new(),
                patience: None,
                _own: own,
            }),
            REFUSED => {
                let reason = String::from_utf8_lossy(&reason).into_owned();
                // At its connection cap, the server may have room later.
                if let Some(busy) = reason.strip_prefix(BUSY_REASON_PREFIX) {
                    return Err(Attempt::Retry(format!("{peer}: refused: {busy}")));
                }
                Err(Attempt::Final(Error::StoreRefused {
                    addr: self.addr.clone(),
                    reason,
                }))
            }
            other => Err(Attempt::Final(Error::Protocol {
                expected: "handshake status 0 (accepted) or 1 (refused)".into(),
                found: format!("status {other}"),
            })),
        }
    }
}

fn time_left(deadline: Option<Instant>) -> Duration {
    deadline.map_or(Duration::MAX, |d| {
        d.saturating_duration_since(Instant::now())
    })
}

/// Why one request/reply exchange failed.
enum Exchange {
    /// The connection broke or timed out; the reason says how.
    Io(String),
    /// The reply announced more bytes than the maximum message size.
    TooLarge(u64),
    /// The reply did not decode.
    Decode(Error),
}

/// One open, handshaken connection.
struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    /// The request to send, then the reply received.
    buf: Vec<u8>,
    /// The socket timeouts currently set.
    patience: Option<Duration>,
    /// Registered as this process's while open (after `stream`, so it is
    /// dropped after the socket closes).
    _own: OwnConnection,
}

impl Connection {
    /// Sends the frame in `buf`, reads the reply frame into `buf`.
    fn exchange(&mut self, patience: Duration, max: usize) -> Result<Response, Exchange> {
        if self.patience != Some(patience) {
            self.stream
                .set_read_timeout(Some(patience))
                .and_then(|()| self.stream.set_write_timeout(Some(patience)))
                .map_err(|e| Exchange::Io(format!("could not set the socket timeout: {e}")))?;
            self.patience = Some(patience);
        }
        let lost = |e: io::Error| {
            Exchange::Io(match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    format!("no reply within {patience:?} (is the server hung?)")
                }
                io::ErrorKind::UnexpectedEof => "the server closed the connection".to_string(),
                _ => e.to_string(),
            })
        };
        self.stream.write_all(&self.buf).map_err(lost)?;
        let mut header = [0u8; FRAME_HEADER];
        self.stream.read_exact(&mut header).map_err(lost)?;
        let len = u64::from_le_bytes(header);
        if len > max as u64 {
            return Err(Exchange::TooLarge(len));
        }
        // len <= max, a usize: the conversion is exact.
        self.buf.resize(len as usize, 0);
        self.stream.read_exact(&mut self.buf).map_err(lost)?;
        let response = Response::decode(&self.buf).map_err(Exchange::Decode);
        if self.buf.capacity() > 1 << 20 {
            self.buf = Vec::new();
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    /// A server that welcomes its first connection and answers nothing
    /// else, ever (a stopped process's kernel still accepts and buffers).
    fn hung_server() -> String {
        server(None)
    }

    /// A server that welcomes its first connection, and answers each of
    /// its requests `Done` after `answer_after` (`None`: never), and says
    /// nothing on any other connection.
    fn server(answer_after: Option<Duration>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        thread::spawn(move || {
            for (n, stream) in listener.incoming().enumerate() {
                let Ok(mut stream) = stream else { return };
                thread::spawn(move || {
                    if n == 0 {
                        let mut hello = [0u8; 20];
                        stream.read_exact(&mut hello).unwrap();
                        let mut welcome = MAGIC.to_vec();
                        welcome.extend_from_slice(&1u32.to_le_bytes());
                        welcome.push(ACCEPTED);
                        welcome.extend_from_slice(&0u32.to_le_bytes());
                        stream.write_all(&welcome).unwrap();
                    }
                    let Some(after) = answer_after.filter(|_| n == 0) else {
                        let mut sink = [0u8; 256];
                        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
                        return;
                    };
                    let mut header = [0u8; FRAME_HEADER];
                    while stream.read_exact(&mut header).is_ok() {
                        let mut body = vec![0u8; u64::from_le_bytes(header) as usize];
                        stream.read_exact(&mut body).unwrap();
                        thread::sleep(after);
                        let mut reply = Vec::new();
                        Response::Done.encode_frame(&mut reply);
                        stream.write_all(&reply).unwrap();
                    }
                });
            }
        });
        addr
    }

    /// A server too busy to answer within the 5 s grace, but within the
    /// store's timeout, is not taken for a hung one by an ordinary call (a
    /// grace of at most 5 s alone made 3961 of 4096 clients of a busy
    /// server fail with `StoreConnectionLost`).
    #[test]
    fn a_slow_server_is_waited_for_up_to_the_store_timeout() {
        let addr = server(Some(Duration::from_millis(6500)));
        let options = TcpStoreOptions {
            timeout: Duration::from_secs(60),
            token: None,
            ..TcpStoreOptions::default()
        };
        let store = TcpStore::connect(&addr, &options).unwrap();
        store.set("k", b"v").unwrap();
    }

    /// Within a set-up of 2 s, a store of 60 s whose host stopped fails
    /// the set-up's calls by its deadline (a minute and 5 s otherwise),
    /// a new connection's handshake included.
    #[test]
    fn a_set_up_on_a_stopped_store_host_fails_by_its_deadline() {
        let addr = hung_server();
        let options = TcpStoreOptions {
            timeout: Duration::from_secs(60),
            token: None,
            ..TcpStoreOptions::default()
        };
        let store = std::sync::Arc::new(TcpStore::connect(&addr, &options).unwrap());
        let started = Instant::now();
        let _set_up = reply_grace::set_up_on_this_thread(Duration::from_secs(2));
        let err = store.check(&["k"]).unwrap_err();
        let took = started.elapsed();
        assert!(
            matches!(&err, Error::StoreConnectionLost { reason, .. } if reason.contains("no reply")),
            "{err}"
        );
        assert!(
            took >= Duration::from_millis(1900) && took < Duration::from_secs(3),
            "the check took {took:?}"
        );
        // Its deadline passed: the next call, on a new connection, waits
        // the set-up's grace (1 s) for the handshake.
        let started = Instant::now();
        let err = store.set("k", b"v").unwrap_err();
        let took = started.elapsed();
        assert!(
            matches!(&err, Error::StoreConnectionLost { reason, .. } if reason.contains("handshake")),
            "{err}"
        );
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(2),
            "the set took {took:?}"
        );
    }
}
