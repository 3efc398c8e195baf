//! Ports for a rank 0's TCP store in tests that start ranks as processes.

use std::sync::atomic::{AtomicU32, Ordering};

/// A port that no other test of this process picks (an ephemeral port
/// freed again could be handed to two tests running at once), and that is
/// free now.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + ((std::process::id().wrapping_mul(97) + n) % 30_000) as u16;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
}
