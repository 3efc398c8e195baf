//! [`TransportChoice`]: which transport a CPU group uses between two ranks,
//! from [`CpuOptions`](crate::cpu::backend::CpuOptions) or the
//! `TENSORCOMM_TRANSPORT` environment variable.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// The environment variable read by [`TransportChoice::Env`].
pub const TRANSPORT_ENV: &str = "TENSORCOMM_TRANSPORT";

/// Which transport connects the ranks of a CPU group.
///
/// ```
/// use tensorcomm::cpu::transport::TransportChoice;
///
/// assert_eq!("tcp".parse::<TransportChoice>()?, TransportChoice::Tcp);
/// assert_eq!(TransportChoice::Shm.to_string(), "shm");
/// assert!("udp".parse::<TransportChoice>().unwrap_err().to_string().contains("auto, tcp or shm"));
/// // `Env` reads TENSORCOMM_TRANSPORT (unset or empty: auto).
/// std::env::remove_var("TENSORCOMM_TRANSPORT");
/// assert_eq!(TransportChoice::Env.resolve()?, TransportChoice::Auto);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TransportChoice {
    /// Whatever `TENSORCOMM_TRANSPORT` says when the group is created
    /// (`auto`, `tcp` or `shm`; unset or empty means `auto`). The default.
    #[default]
    Env,
    /// Shared memory with ranks on the same host, TCP with the others.
    Auto,
    /// TCP with every rank.
    Tcp,
    /// Shared memory with every rank; creating the group fails, naming the
    /// rank, if one is on another host.
    Shm,
}

impl TransportChoice {
    /// `Env` replaced by the environment's choice; others unchanged. A
    /// value other than `auto`, `tcp` or `shm` is an [`Error::BadValue`].
    pub fn resolve(self) -> Result<TransportChoice> {
        if self != TransportChoice::Env {
            return Ok(self);
        }
        match std::env::var(TRANSPORT_ENV) {
            Ok(v) if v.trim().is_empty() => Ok(TransportChoice::Auto),
            Ok(v) => v.parse::<TransportChoice>().map_err(|_| Error::BadValue {
                name: TRANSPORT_ENV.into(),
                expected: "auto, tcp or shm".into(),
                found: v,
            }),
            Err(std::env::VarError::NotPresent) => Ok(TransportChoice::Auto),
            Err(std::env::VarError::NotUnicode(v)) => Err(Error::BadValue {
                name: TRANSPORT_ENV.into(),
                expected: "auto, tcp or shm".into(),
                found: v.to_string_lossy().into_owned(),
            }),
        }
    }
}

impl FromStr for TransportChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(TransportChoice::Auto),
            "tcp" => Ok(TransportChoice::Tcp),
            "shm" => Ok(TransportChoice::Shm),
            _ => Err(Error::BadValue {
                name: "transport".into(),
                expected: "auto, tcp or shm".into(),
                found: s.into(),
            }),
        }
    }
}

impl fmt::Display for TransportChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransportChoice::Env => "env",
            TransportChoice::Auto => "auto",
            TransportChoice::Tcp => "tcp",
            TransportChoice::Shm => "shm",
        })
    }
}
