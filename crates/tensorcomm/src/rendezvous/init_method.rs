//! Parsing an init method (`env://`, `tcp://`, `file://`) into a plan.

use std::path::PathBuf;

use crate::{Error, Result};

/// Where the ranks meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreAddress {
    /// A TCP store hosted by rank 0 at `host:port`.
    Tcp { host: String, port: u16 },
    /// A file store at this path.
    File { path: PathBuf },
}

/// Everything an init method says: where to meet, and who this process is.
///
/// ```
/// use tensorcomm::rendezvous::{InitMethod, StoreAddress};
///
/// let m = InitMethod::parse("tcp://10.1.2.3:29500?rank=1&world_size=4", |_| None)?;
/// assert_eq!(m.rank, 1);
/// assert_eq!(m.world_size, 4);
/// assert_eq!(m.address, StoreAddress::Tcp { host: "10.1.2.3".into(), port: 29500 });
///
/// let env = |name: &str| match name {
///     "MASTER_ADDR" => Some("node0".to_string()),
///     "MASTER_PORT" => Some("29500".to_string()),
///     "SLURM_PROCID" => Some("3".to_string()),
///     "SLURM_NTASKS" => Some("8".to_string()),
///     _ => None,
/// };
/// let m = InitMethod::parse("env://", env)?;
/// assert_eq!((m.rank, m.world_size), (3, 8));
///
/// let err = InitMethod::parse("env://", |_| None).unwrap_err();
/// assert!(err.to_string().contains("MASTER_ADDR"));
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitMethod {
    pub address: StoreAddress,
    pub rank: usize,
    pub world_size: usize,
    /// This process's index among the ranks of its node, when known.
    pub local_rank: Option<usize>,
    /// How many ranks run on this node, when known.
    pub local_world_size: Option<usize>,
}

/// Each value `env://` reads, with the variables tried in order:
/// torchrun's, then SLURM's, then Open MPI's.
const RANK_VARS: &[&str] = &["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"];
const WORLD_VARS: &[&str] = &["WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"];
const LOCAL_RANK_VARS: &[&str] = &["LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"];
const LOCAL_WORLD_VARS: &[&str] = &[
    "LOCAL_WORLD_SIZE",
    "SLURM_NTASKS_PER_NODE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
];

impl InitMethod {
    /// Parses `url`, reading environment variables through `env`.
    ///
    /// Pass `|name| std::env::var(name).ok()` to read the real environment.
    pub fn parse(url: &str, env: impl Fn(&str) -> Option<String>) -> Result<Self> {
        if let Some(rest) = url.strip_prefix("env://") {
            return Self::from_env(url, rest, &env);
        }
        if let Some(rest) = url.strip_prefix("tcp://") {
            let (authority, params) = split_query(rest);
            let (host, port) = parse_host_port(url, authority)?;
            let (rank, world_size) = rank_and_world(url, &params)?;
            return Ok(InitMethod {
                address: StoreAddress::Tcp { host, port },
                rank,
                world_size,
                local_rank: optional_param(&params, "local_rank")?,
                local_world_size: optional_param(&params, "local_world_size")?,
            });
        }
        if let Some(rest) = url.strip_prefix("file://") {
            let (path, params) = split_query(rest);
            if path.is_empty() {
                return Err(Error::MissingParam {
                    url: url.into(),
                    name: "path".into(),
                });
            }
            let (rank, world_size) = rank_and_world(url, &params)?;
            return Ok(InitMethod {
                address: StoreAddress::File { path: path.into() },
                rank,
                world_size,
                local_rank: optional_param(&params, "local_rank")?,
                local_world_size: optional_param(&params, "local_world_size")?,
            });
        }
        Err(Error::UnsupportedInitMethod { found: url.into() })
    }

    fn from_env(url: &str, rest: &str, env: &impl Fn(&str) -> Option<String>) -> Result<Self> {
        let (_, params) = split_query(rest);
        let required = |name: &str| {
            env(name).ok_or_else(|| Error::MissingEnv {
                name: name.into(),
                context: format!("init method {url}"),
            })
        };
        let host = required("MASTER_ADDR")?;
        if host.trim().is_empty() {
            return Err(Error::BadValue {
                name: "MASTER_ADDR".into(),
                expected: "the host name or address of rank 0".into(),
                found: format!("{host:?}"),
            });
        }
        let port = parse_number::<u16>(
            "MASTER_PORT",
            &required("MASTER_PORT")?,
            "a port number (0-65535)",
        )?;
        // URL parameters, when given, win over the environment.
        let rank = match optional_param(&params, "rank")? {
            Some(r) => r,
            None => first_var(env, RANK_VARS, url)?,
        };
        let world_size = match optional_param(&params, "world_size")? {
            Some(w) => w,
            None => first_var(env, WORLD_VARS, url)?,
        };
        check_rank(rank, world_size)?;
        Ok(InitMethod {
            address: StoreAddress::Tcp { host, port },
            rank,
            world_size,
            local_rank: first_present(env, LOCAL_RANK_VARS)?,
            local_world_size: first_present(env, LOCAL_WORLD_VARS)?,
        })
    }
}

/// The first variable of `names` that is set, parsed; an error naming the
/// first (the torchrun name) if none is set.
fn first_var(env: &impl Fn(&str) -> Option<String>, names: &[&str], url: &str) -> Result<usize> {
    first_present(env, names)?.ok_or_else(|| Error::MissingEnv {
        name: names[0].into(),
        context: format!(
            "init method {url}; {} are read too",
            names[1..].join(" and ")
        ),
    })
}

fn first_present(env: &impl Fn(&str) -> Option<String>, names: &[&str]) -> Result<Option<usize>> {
    for name in names {
        if let Some(value) = env(name) {
            return parse_number(name, &value, "a non-negative integer").map(Some);
        }
    }
    Ok(None)
}

fn split_query(s: &str) -> (&str, Vec<(&str, &str)>) {
    match s.split_once('?') {
        None => (s, Vec::new()),
        Some((head, query)) => (
            head,
            query
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| p.split_once('=').unwrap_or((p, "")))
                .collect(),
        ),
    }
}

fn parse_host_port(url: &str, authority: &str) -> Result<(String, u16)> {
    let authority = authority.trim_end_matches('/');
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, rest) = v6.split_once(']').ok_or_else(|| Error::BadValue {
            name: "host".into(),
            expected: "an IPv6 address in brackets such as [::1]:29500".into(),
            found: authority.into(),
        })?;
        let port = match rest {
            "" => None,
            _ => Some(rest.strip_prefix(':').ok_or_else(|| Error::BadValue {
                name: "host".into(),
                expected: "[IPv6 address]:port".into(),
                found: authority.into(),
            })?),
        };
        check_host(host, true)?;
        (host, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(Error::MissingParam {
            url: url.into(),
            name: "host".into(),
        });
    }
    if !authority.starts_with('[') {
        check_host(host, false)?;
    }
    let port = port.ok_or_else(|| Error::MissingParam {
        url: url.into(),
        name: "port".into(),
    })?;
    Ok((
        host.into(),
        parse_number("port", port, "a port number (0-65535)")?,
    ))
}

/// A host name (letters, digits, `-`, `.`, `_`), an IPv4 address or, in
/// brackets, an IPv6 address (hex digits, `:` and `.`): nothing that
/// needs decoding (`%00`), no spaces, controls or other URL syntax.
fn check_host(host: &str, v6: bool) -> Result<()> {
    let ok = if v6 {
        host.contains(':')
            && host
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
    } else {
        host.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    };
    if ok {
        return Ok(());
    }
    Err(Error::BadValue {
        name: "host".into(),
        expected: if v6 {
            "an IPv6 address (hex digits, ':' and '.') in brackets".into()
        } else {
            "a host name (letters, digits, '-', '.', '_') or an IP address".into()
        },
        found: host.into(),
    })
}

fn rank_and_world(url: &str, params: &[(&str, &str)]) -> Result<(usize, usize)> {
    let get = |name: &str| {
        optional_param(params, name)?.ok_or_else(|| Error::MissingParam {
            url: url.into(),
            name: name.into(),
        })
    };
    let (rank, world_size) = (get("rank")?, get("world_size")?);
    check_rank(rank, world_size)?;
    Ok((rank, world_size))
}

fn optional_param(params: &[(&str, &str)], name: &str) -> Result<Option<usize>> {
    let mut given = params.iter().filter(|(k, _)| *k == name);
    let first = given.next();
    if let (Some((_, a)), Some((_, b))) = (first, given.next()) {
        return Err(Error::BadValue {
            name: name.into(),
            expected: "given once".into(),
            found: format!("{name}={a} and {name}={b}"),
        });
    }
    first
        .map(|(_, v)| parse_number(name, v, "a non-negative integer"))
        .transpose()
}

fn check_rank(rank: usize, world_size: usize) -> Result<()> {
    if world_size == 0 {
        return Err(Error::BadValue {
            name: "world_size".into(),
            expected: "at least 1".into(),
            found: "0".into(),
        });
    }
    if rank >= world_size {
        return Err(Error::BadValue {
            name: "rank".into(),
            expected: format!("less than world_size {world_size}"),
            found: rank.to_string(),
        });
    }
    Ok(())
}

fn parse_number<T: std::str::FromStr>(name: &str, value: &str, expected: &str) -> Result<T> {
    value.trim().parse().map_err(|_| Error::BadValue {
        name: name.into(),
        expected: expected.into(),
        found: value.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn env_reads_the_torchrun_contract() {
        let env = env_of(&[
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("SLURM_PROCID", "9"),
        ]);
        let m = InitMethod::parse("env://", env).unwrap();
        assert_eq!(
            m,
            InitMethod {
                address: StoreAddress::Tcp {
                    host: "127.0.0.1".into(),
                    port: 29500
                },
                rank: 2,
                world_size: 4,
                local_rank: Some(0),
                local_world_size: Some(2),
            }
        );
    }

    #[test]
    fn env_falls_back_to_slurm_then_open_mpi() {
        let base = [("MASTER_ADDR", "h"), ("MASTER_PORT", "1")];
        let slurm = [
            &base[..],
            &[
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_LOCALID", "1"),
            ],
        ]
        .concat();
        let m = InitMethod::parse("env://", env_of(&slurm)).unwrap();
        assert_eq!((m.rank, m.world_size, m.local_rank), (1, 2, Some(1)));
        let ompi = [
            &base[..],
            &[
                ("OMPI_COMM_WORLD_RANK", "5"),
                ("OMPI_COMM_WORLD_SIZE", "6"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
            ],
        ]
        .concat();
        let m = InitMethod::parse("env://", env_of(&ompi)).unwrap();
        assert_eq!(
            (m.rank, m.world_size, m.local_rank, m.local_world_size),
            (5, 6, Some(1), Some(3))
        );
    }

    #[test]
    fn env_errors_name_the_missing_variable() {
        let err = InitMethod::parse("env://", env_of(&[("MASTER_ADDR", "h")])).unwrap_err();
        assert!(
            matches!(&err, Error::MissingEnv { name, .. } if name == "MASTER_PORT"),
            "{err}"
        );
        let err = InitMethod::parse(
            "env://",
            env_of(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("RANK"), "{err}");
        let err = InitMethod::parse(
            "env://",
            env_of(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "1"), ("RANK", "0")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("WORLD_SIZE"), "{err}");
        let bad_port = env_of(&[
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "99999"),
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
        ]);
        let err = InitMethod::parse("env://", bad_port).unwrap_err();
        assert!(
            err.to_string().contains("MASTER_PORT") && err.to_string().contains("99999"),
            "{err}"
        );
        let bad_rank = env_of(&[
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
            ("RANK", "x"),
            ("WORLD_SIZE", "1"),
        ]);
        assert!(InitMethod::parse("env://", bad_rank)
            .unwrap_err()
            .to_string()
            .contains("\"x\""));
    }

    #[test]
    fn tcp_and_file_urls_parse() {
        let m = InitMethod::parse("tcp://[::1]:1234?world_size=3&rank=0", |_| None).unwrap();
        assert_eq!(
            m.address,
            StoreAddress::Tcp {
                host: "::1".into(),
                port: 1234
            }
        );
        assert_eq!((m.rank, m.world_size), (0, 3));
        let m = InitMethod::parse("file:///tmp/rdzv?rank=1&world_size=2", |_| None).unwrap();
        assert_eq!(
            m.address,
            StoreAddress::File {
                path: "/tmp/rdzv".into()
            }
        );
        assert_eq!(m.rank, 1);
    }

    #[test]
    fn url_errors_name_the_problem() {
        let missing = |url: &str, name: &str| {
            let err = InitMethod::parse(url, |_| None).unwrap_err();
            assert!(
                matches!(&err, Error::MissingParam { name: n, .. } if n == name),
                "{url}: {err}"
            );
        };
        missing("tcp://host:1?world_size=2", "rank");
        missing("tcp://host:1?rank=0", "world_size");
        missing("tcp://host?rank=0&world_size=1", "port");
        missing("tcp://:5?rank=0&world_size=1", "host");
        missing("file://?rank=0&world_size=1", "path");
        let err = InitMethod::parse("tcp://h:1?rank=2&world_size=2", |_| None).unwrap_err();
        assert!(err.to_string().contains("less than world_size 2"), "{err}");
        let err = InitMethod::parse("tcp://h:1?rank=0&world_size=0", |_| None).unwrap_err();
        assert!(err.to_string().contains("at least 1"), "{err}");
        let err = InitMethod::parse("mpi://", |_| None).unwrap_err();
        assert!(matches!(err, Error::UnsupportedInitMethod { .. }));
    }

    #[test]
    fn an_empty_master_addr_is_refused() {
        // Found by fuzzing: env:// accepted MASTER_ADDR="" as the host.
        for empty in ["", "  "] {
            let env = env_of(&[
                ("MASTER_ADDR", empty),
                ("MASTER_PORT", "29500"),
                ("RANK", "0"),
                ("WORLD_SIZE", "1"),
            ]);
            let err = InitMethod::parse("env://", env).unwrap_err().to_string();
            assert!(err.contains("MASTER_ADDR"), "{err}");
        }
    }
}
