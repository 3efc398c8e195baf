//! Where a listening socket binds: the one address peers are told to reach
//! it at (rank 0's store on `MASTER_ADDR`'s interface, a CPU transport on
//! its advertised address), not every interface of the host, unless
//! `TENSORCOMM_BIND_ALL=1` asks for every interface. A `MASTER_ADDR` that
//! is a host name binds loopback when it resolves to loopback here, and
//! every interface otherwise (a name can stand for several addresses, and
//! resolve differently on other nodes).
//!
//! An address that is not one of this host's interfaces cannot be bound:
//! that is an error naming the address and what to set instead
//! ([`Error::ListenAddress`]), never a silent fall back to every
//! interface. A `MASTER_ADDR` that resolves to loopback on rank 0 while
//! the job spans several nodes is refused the same way, since ranks on the
//! other nodes could never reach it.
//!
//! ```
//! use tensorcomm::listen_address::listen_host;
//! assert_eq!(listen_host("10.0.0.7", false), "10.0.0.7");
//! assert_eq!(listen_host("10.0.0.7", true), "0.0.0.0");
//! assert_eq!(listen_host("fe80::1", true), "::");
//! ```

use std::io;
use std::net::ToSocketAddrs;

use crate::env_vars::BIND_ALL;
use crate::{Error, Result};

/// `TENSORCOMM_BIND_ALL`: `Ok(true)` for `1`, `Ok(false)` when unset,
/// empty or `0`, and [`Error::BadValue`] naming the variable otherwise.
pub fn bind_all_from_env() -> Result<bool> {
    parse_bind_all(BIND_ALL.get().as_deref())
}

fn parse_bind_all(value: Option<&str>) -> Result<bool> {
    match value.map(str::trim) {
        None | Some("" | "0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(Error::BadValue {
            name: BIND_ALL.name.into(),
            expected: "0 (listen only where peers are told to connect) or 1 (every interface)"
                .into(),
            found: other.into(),
        }),
    }
}

/// The host a listener for peers that reach it at `host` binds: `host`
/// itself, or the wildcard of its address family when `bind_all`.
pub fn listen_host(host: &str, bind_all: bool) -> &str {
    match (bind_all, host.contains(':')) {
        (false, _) => host,
        (true, true) => "::",
        (true, false) => "0.0.0.0",
    }
}

/// Whether `host` is an IP address (IPv6 with or without brackets), not a
/// name.
fn is_ip_literal(host: &str) -> bool {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
        .is_ok()
}

/// Whether a `host:port` resolves only to loopback addresses (`false` when
/// it does not resolve: binding then says why).
pub(crate) fn resolves_to_loopback(addr: &str) -> bool {
    let Ok(resolved) = addr.to_socket_addrs() else {
        return false;
    };
    let ips: Vec<_> = resolved.map(|a| a.ip()).collect();
    !ips.is_empty() && ips.iter().all(|ip| ip.is_loopback())
}

/// Where rank 0 hosts the TCP store for a job whose `MASTER_ADDR` is
/// `host`: `host:port`, or the wildcard with `bind_all`. `nodes` is the
/// job's `(WORLD_SIZE, LOCAL_WORLD_SIZE)` where known: a job that spans
/// several nodes cannot host its store on loopback.
pub(crate) fn store_listen_address(
    host: &str,
    port: u16,
    nodes: Option<(usize, usize)>,
    bind_all: bool,
) -> Result<String> {
    let addr = crate::rendezvous::host_port(listen_host(host, bind_all), port);
    if bind_all {
        return Ok(addr);
    }
    if !is_ip_literal(host) && !resolves_to_loopback(&addr) {
        // A host name may stand for several addresses (IPv4 and IPv6, a
        // management and a data interface) and resolve differently on the
        // other nodes, or not yet resolve at all: binding one of them could
        // shut out ranks that reach another, so a name that is not
        // loopback here listens on every interface, as before.
        tracing::debug!(
            host,
            "MASTER_ADDR is a host name: the store listens on every interface (an IP address \
             as MASTER_ADDR narrows it to that interface)"
        );
        return Ok(crate::rendezvous::host_port(listen_host(host, true), port));
    }
    if let Some((world, local)) = nodes.filter(|&(world, local)| local < world) {
        if resolves_to_loopback(&addr) {
            return Err(Error::ListenAddress {
                what: "the TCP store (rank 0)".into(),
                addr,
                reason: format!(
                    "MASTER_ADDR {host} is a loopback address on this host, but the job \
                     spans several nodes (WORLD_SIZE {world}, LOCAL_WORLD_SIZE {local}) whose \
                     ranks could not reach it; set MASTER_ADDR to this host's network address, \
                     or {}=1 to listen on every interface",
                    BIND_ALL.name
                ),
            });
        }
    }
    Ok(addr)
}

/// Turns a failure to bind `addr` into [`Error::ListenAddress`] when the
/// address is not one of this host's (`EADDRNOTAVAIL`); other errors pass
/// through. `told` names how peers learnt the address (`MASTER_ADDR`, the
/// advertised address).
pub(crate) fn explain_bind_error(err: Error, what: &str, addr: &str, told: &str) -> Error {
    let not_local = |e: &io::Error| e.kind() == io::ErrorKind::AddrNotAvailable;
    match err {
        Error::Io { ref source, .. } if not_local(source) => not_here(what, addr, told),
        other => other,
    }
}

/// [`Error::ListenAddress`] for an address that is not this host's.
pub(crate) fn not_here(what: &str, addr: &str, told: &str) -> Error {
    Error::ListenAddress {
        what: what.into(),
        addr: addr.into(),
        reason: format!(
            "{told} is not an address of this host's interfaces (peers would be told to \
             connect to a host that is not this one); run it on the host {told} names, or \
             set {}=1 to listen on every interface",
            BIND_ALL.name
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_name_listens_on_loopback_or_everywhere_and_an_ip_on_itself() {
        assert!(is_ip_literal("10.0.0.7") && is_ip_literal("[fe80::1]") && is_ip_literal("::1"));
        assert!(!is_ip_literal("localhost") && !is_ip_literal("node-3.cluster"));
        assert_eq!(
            store_listen_address("10.0.0.7", 29500, None, false).unwrap(),
            "10.0.0.7:29500"
        );
        assert_eq!(
            store_listen_address("localhost", 29500, Some((2, 2)), false).unwrap(),
            "localhost:29500"
        );
        // `.invalid` never resolves (RFC 6761): a name that is not (yet)
        // loopback here listens everywhere.
        assert_eq!(
            store_listen_address("node-3.invalid", 29500, None, false).unwrap(),
            "0.0.0.0:29500"
        );
    }

    #[test]
    fn bind_all_parses_0_and_1_and_names_anything_else() {
        assert!(!parse_bind_all(None).unwrap());
        assert!(!parse_bind_all(Some("")).unwrap());
        assert!(!parse_bind_all(Some("0")).unwrap());
        assert!(parse_bind_all(Some("1")).unwrap());
        match parse_bind_all(Some("yes")) {
            Err(Error::BadValue { name, found, .. }) => {
                assert_eq!(name, "TENSORCOMM_BIND_ALL");
                assert_eq!(found, "yes");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_store_listens_on_master_addr_unless_every_interface_is_asked_for() {
        let at = |host, nodes, all| store_listen_address(host, 29500, nodes, all);
        assert_eq!(at("127.0.0.1", None, false).unwrap(), "127.0.0.1:29500");
        assert_eq!(at("::1", None, false).unwrap(), "[::1]:29500");
        assert_eq!(
            at("10.1.2.3", Some((8, 4)), false).unwrap(),
            "10.1.2.3:29500"
        );
        assert_eq!(at("10.1.2.3", None, true).unwrap(), "0.0.0.0:29500");
        assert_eq!(at("::1", None, true).unwrap(), "[::]:29500");
        // One node: loopback is right.
        assert_eq!(
            at("localhost", Some((4, 4)), false).unwrap(),
            "localhost:29500"
        );
        // Several nodes: loopback cannot be reached from the others.
        match at("127.0.0.1", Some((8, 4)), false) {
            Err(Error::ListenAddress { addr, reason, .. }) => {
                assert_eq!(addr, "127.0.0.1:29500");
                assert!(reason.contains("spans several nodes"), "{reason}");
                assert!(reason.contains("TENSORCOMM_BIND_ALL=1"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            at("127.0.0.1", Some((8, 4)), true).unwrap(),
            "0.0.0.0:29500"
        );
    }
}
