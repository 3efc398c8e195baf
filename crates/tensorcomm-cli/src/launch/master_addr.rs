//! Checking `--master-addr` before any rank starts.
//!
//! Every rank connects to the store at `--master-addr`: where it does not
//! resolve, ranks other than 0 retry until their timeout (30 minutes by
//! default), saying so every 5 s. On node 0, which runs rank 0 and so
//! hosts the store, the address names this very host: if it does not
//! resolve here within [`GRACE`], it never will for this node's ranks, and
//! the launcher refuses the job at once, naming it. On another node the
//! address may resolve later (a cluster's DNS can publish node 0's name
//! only once node 0 is up), so the launcher only says so and starts the
//! ranks, which keep trying.

use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

/// How long node 0's launcher tries to resolve `--master-addr`.
pub const GRACE: Duration = Duration::from_secs(5);
/// The pause between tries.
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// What resolving said: nothing when the address resolved, else why not.
pub type Resolve<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Resolves `host_port` through the system's resolver: `None` when it
/// names at least one address.
pub fn system_resolve(host_port: &str) -> Option<String> {
    match host_port.to_socket_addrs() {
        Ok(addrs) if addrs.len() > 0 => None,
        Ok(_) => Some("it resolved to no address".into()),
        Err(e) => Some(e.to_string()),
    }
}

/// Whether the job may start: an error for node 0 when `host` does not
/// resolve within `grace`; for another node, a warning to print (or none).
pub fn check(
    host: &str,
    port: u16,
    node_rank: usize,
    grace: Duration,
    resolve: Resolve,
) -> Result<Option<String>, String> {
    let addr = tensorcomm::rendezvous::host_port(host, port);
    let started = Instant::now();
    let mut reason = match resolve(&addr) {
        None => return Ok(None),
        Some(reason) => reason,
    };
    if node_rank != 0 {
        return Ok(Some(format!(
            "--master-addr {host:?} does not resolve on node {node_rank} yet ({reason}); its ranks keep trying to reach the store until their timeout"
        )));
    }
    while started.elapsed() < grace {
        std::thread::sleep(RETRY_EVERY.min(grace.saturating_sub(started.elapsed())));
        match resolve(&addr) {
            None => return Ok(None),
            Some(again) => reason = again,
        }
    }
    Err(format!(
        "--master-addr {host:?} does not resolve on this host ({reason}, tried for {grace:?}): node 0 runs rank 0, which hosts the rendezvous store there, so the other ranks could not reach it; expected a host name or IP address of this node"
    ))
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn an_address_that_resolves_passes_at_once() {
        let seen = Cell::new(Vec::new());
        let resolve = |a: &str| {
            let mut v = seen.take();
            v.push(a.to_string());
            seen.set(v);
            None
        };
        assert_eq!(check("::1", 29500, 0, GRACE, &resolve), Ok(None));
        assert_eq!(seen.take(), ["[::1]:29500"]);
        assert_eq!(check("127.0.0.1", 1, 0, GRACE, &system_resolve), Ok(None));
    }

    #[test]
    fn node_0_refuses_an_address_that_never_resolves_after_its_grace() {
        let tries = Cell::new(0);
        let resolve = |_: &str| {
            tries.set(tries.get() + 1);
            Some("Name or service not known".to_string())
        };
        let grace = Duration::from_millis(1200);
        let started = Instant::now();
        let err = check("node0.invalid", 29500, 0, grace, &resolve).unwrap_err();
        assert!(started.elapsed() >= grace, "{:?}", started.elapsed());
        assert!(tries.get() >= 3, "{}", tries.get());
        assert!(
            err.starts_with("--master-addr \"node0.invalid\" does not resolve on this host (Name or service not known, tried for 1.2s)"),
            "{err}"
        );
    }

    #[test]
    fn node_0_starts_once_the_address_resolves_within_its_grace() {
        let tries = Cell::new(0);
        let resolve = |_: &str| {
            tries.set(tries.get() + 1);
            (tries.get() < 3).then(|| "Temporary failure in name resolution".to_string())
        };
        assert_eq!(check("node0", 29500, 0, GRACE, &resolve), Ok(None));
        assert_eq!(tries.get(), 3);
    }

    #[test]
    fn another_node_only_warns_since_the_address_may_resolve_later() {
        let resolve = |_: &str| Some("Name or service not known".to_string());
        let warning = check("node0", 29500, 2, GRACE, &resolve).unwrap().unwrap();
        assert!(
            warning.starts_with("--master-addr \"node0\" does not resolve on node 2 yet"),
            "{warning}"
        );
    }
}
