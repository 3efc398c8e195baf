//! The TCP store: a key-value server that ranks reach over TCP.
//!
//! One process (rank 0, or `tensorcomm store serve`) runs a
//! [`TcpStoreServer`]; every rank connects a [`TcpStore`] to it. The server
//! is a small tokio runtime with one task per connection, so thousands of
//! ranks cost thousands of tasks, not threads. A request blocked on missing
//! keys registers a waiter under exactly those keys and is woken by the
//! write that creates them; nothing polls.
//!
//! The wire format (see `protocol.rs`) is length-prefixed binary: a
//! handshake with a magic number, a protocol version and an optional shared
//! token ([`TcpStoreOptions::token`], `$TENSORCOMM_STORE_TOKEN`), then one
//! frame per request and one per reply. A client that sends anything else
//! (garbage, an oversize or truncated frame, an unknown opcode, a wrong
//! token) is disconnected; the server keeps serving everyone else.
//!
//! - `protocol.rs`: the bytes on the wire.
//! - `server.rs`: [`TcpStoreServer`], binding and accepting.
//! - `connection.rs`: one connection on the server, handshake and requests.
//! - `handshakes.rs`: connections not yet past their handshake, which make
//!   room for others when the server is at its connection cap.
//! - `connection_limit.rs`: the connection cap, fitted to the process's
//!   file descriptor limit.
//! - `server_state.rs`: the keys and the per-key waiters.
//! - `client.rs`: [`TcpStore`], the client.
//! - `own_connections.rs`: the client connections this process has open,
//!   told apart from other processes' by their addresses.
//! - `at_exit.rs`: a hosting store keeps serving other processes' clients
//!   while its process exits, up to its linger.
//! - `options.rs`: [`TcpStoreOptions`].
//!
//! ```
//! use std::time::Duration;
//! use tensorcomm::{Error, store::{Store, TcpStore, TcpStoreOptions}};
//!
//! let options = TcpStoreOptions { timeout: Duration::from_secs(5), ..Default::default() };
//! let store = TcpStore::host("127.0.0.1:0", 1, &options)?;
//! store.set("x", b"1")?;
//! // A wait that times out leaves the client usable.
//! let err = store.get_timeout("y", Duration::from_millis(20)).unwrap_err();
//! assert!(matches!(err, Error::StoreTimeout { .. }));
//! assert_eq!(store.get("x")?, b"1");
//! # Ok::<(), tensorcomm::Error>(())
//! ```

mod at_exit;
mod client;
mod connection;
mod connection_limit;
mod handshakes;
mod options;
mod own_connections;
mod protocol;
pub(crate) mod reply_grace;
mod server;
mod server_state;
mod warn_limit;

pub use client::TcpStore;
pub use options::{
    TcpStoreOptions, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_MESSAGE_SIZE,
    TOKEN_ENV,
};
pub use server::TcpStoreServer;

/// What the fuzz targets drive (see `crate::fuzz_targets`).
pub(crate) mod fuzzing {
    pub(crate) use super::connection::{handshake, serve_requests, ServerConfig};
    pub(crate) use super::handshakes::Handshakes;
    pub(crate) use super::protocol::{encode_hello, Request, Response, FRAME_HEADER, MAGIC};
    pub(crate) use super::server_state::ServerState;
}
