//! Settings shared by the TCP store's server and clients.

use std::fmt;
use std::time::Duration;

use crate::store::DEFAULT_TIMEOUT;

/// The environment variable a [`TcpStoreOptions::default`] reads its shared
/// secret from.
pub const TOKEN_ENV: &str = "TENSORCOMM_STORE_TOKEN";

/// The default largest message (request or reply) either side accepts: 64 MiB.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 64 << 20;

/// How a [`super::TcpStoreServer`] serves and a [`super::TcpStore`] connects.
///
/// ```
/// use std::time::Duration;
/// use tensorcomm::store::TcpStoreOptions;
///
/// let options = TcpStoreOptions {
///     timeout: Duration::from_secs(30),
///     token: Some("s3cret".into()),
///     ..TcpStoreOptions::default()
/// };
/// assert_eq!(options.max_message_size, 64 << 20);
/// // The token never shows up in logs.
/// assert!(!format!("{options:?}").contains("s3cret"));
/// ```
#[derive(Clone)]
pub struct TcpStoreOptions {
    /// The default timeout of blocking calls, and how long a client keeps
    /// retrying to connect (300 s by default).
    pub timeout: Duration,
    /// A shared secret: a server with a token refuses clients that do not
    /// present the same one. Defaults to `$TENSORCOMM_STORE_TOKEN` if set and
    /// not empty.
    pub token: Option<String>,
    /// The largest message, in bytes, either side accepts (64 MiB by default).
    /// A peer announcing a larger one is disconnected before anything is
    /// allocated for it.
    pub max_message_size: usize,
    /// How long a store that hosts its server ([`super::TcpStore::host`],
    /// rank 0) waits, when dropped, for the other clients to disconnect
    /// before stopping the server (10 s by default). Ranks that finish a
    /// moment after rank 0 then still get their last replies. A process
    /// that exits with the store still alive (`std::process::exit`, or a
    /// return from `main`) waits as long for the clients of other
    /// processes.
    pub linger: Duration,
    /// How long a server waits for the rest of a request once its first
    /// byte came (30 s by default): a client silent in the middle of a
    /// frame is disconnected. A client idle between requests is not.
    pub idle_timeout: Duration,
    /// The most connections a server keeps open at once (65536 by
    /// default), lowered where the process's open-file limit (`ulimit -n`)
    /// leaves less room: an eighth of that limit (at least 128 files) is
    /// kept for the rest of the process. At the cap, a connection still in
    /// its handshake (no valid hello yet) is closed to make room, so
    /// unauthenticated connections never crowd out authenticated ones;
    /// when every open connection has authenticated, one more is refused
    /// saying so, and its client tries again until its timeout (then fails
    /// with [`crate::Error::StoreConnect`] naming the cap), since a
    /// connection may free up.
    pub max_connections: usize,
}

/// The default [`TcpStoreOptions::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The default [`TcpStoreOptions::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1 << 16;

/// The default [`TcpStoreOptions::linger`].
pub const DEFAULT_LINGER: Duration = Duration::from_secs(10);

impl Default for TcpStoreOptions {
    fn default() -> Self {
        TcpStoreOptions {
            timeout: DEFAULT_TIMEOUT,
            token: std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            linger: DEFAULT_LINGER,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl fmt::Debug for TcpStoreOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpStoreOptions")
            .field("timeout", &self.timeout)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("max_message_size", &self.max_message_size)
            .field("linger", &self.linger)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}
