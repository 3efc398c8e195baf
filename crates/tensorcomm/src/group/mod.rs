//! Backend-agnostic process groups: the [`ProcessGroup`] trait, [`Work`]
//! handles, [`ReduceOp`], and [`init_process_group`].
//!
//! Every collective checks its arguments on the calling rank first (a
//! typed error, nothing sent, the group still usable), then takes the next
//! sequence number and returns a [`Work`]. Each collective carries a small
//! fingerprint (op, reduce op, dtype, element count, shape and strides
//! hash, root, sequence number) in front of the first message to each
//! peer; a receiver whose own fingerprint differs fails with
//! [`Error::CollectiveMismatch`](crate::Error::CollectiveMismatch) naming
//! both. A failed collective (a peer closed its connection, timed out, or
//! mismatched) fails with
//! [`Error::CollectiveFailed`](crate::Error::CollectiveFailed) naming the op,
//! the sequence number and the peer ranks involved; the group then closes
//! its connections so that every other rank fails promptly too, and later
//! calls fail with [`Error::GroupBroken`](crate::Error::GroupBroken).
//!
//! ```
//! use tensorcomm::group::{init_process_group, Backend, ReduceOp};
//! use tensorcomm::tensor::Tensor;
//!
//! let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
//! let grads = Tensor::from_vec(vec![2.0f32; 4], &[4])?;
//! pg.all_reduce(&grads, ReduceOp::Avg, None)?.wait()?;
//! pg.broadcast(&grads, 0, None)?.wait()?;
//! pg.barrier(None)?.wait()?;
//! assert_eq!(grads.to_vec::<f32>()?, [2.0; 4]);
//! # Ok::<(), tensorcomm::Error>(())
//! ```

pub(crate) mod fingerprint;
mod reduce_op;
pub(crate) mod validate;
mod work;

use std::net::UdpSocket;
use std::sync::Arc;
use std::time::Duration;

pub use reduce_op::ReduceOp;
pub use work::Work;

use crate::cpu::backend::{CpuOptions, ProcessGroupCpu};
use crate::rendezvous::{self, InitMethod, StoreAddress};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// How long a collective may take unless the call says otherwise (c10d's
/// default).
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Which implementation runs the collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The CPU backend: host tensors over TCP.
    Cpu,
}

impl std::str::FromStr for Backend {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" | "gloo" => Ok(Backend::Cpu),
            _ => Err(Error::BadValue {
                name: "backend".into(),
                expected: "cpu".into(),
                found: s.into(),
            }),
        }
    }
}

/// A group of ranks running collectives together.
///
/// Collectives run in call order on the group's own thread; tensors are
/// handles (`Tensor<'static>`, so they can outlive the call) whose storage
/// the collective writes in place. `timeout` overrides the group's default
/// for one call.
pub trait ProcessGroup: Send + Sync {
    /// This rank in the group.
    fn rank(&self) -> usize;

    /// The number of ranks in the group.
    fn size(&self) -> usize;

    /// The backend running the collectives.
    fn backend(&self) -> Backend;

    /// Reduces `tensor` over all ranks with `op`; every rank gets the result
    /// in place.
    fn all_reduce(
        &self,
        tensor: &Tensor<'static>,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// Copies `tensor` of rank `root` into `tensor` of every rank.
    fn broadcast(
        &self,
        tensor: &Tensor<'static>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// Completes once every rank has called it.
    fn barrier(&self, timeout: Option<Duration>) -> Result<Work>;
}

/// Meets the other ranks through `init_method` (`env://`,
/// `tcp://host:port?rank=R&world_size=W`, `file:///path?rank=R&world_size=W`)
/// and builds the default process group of `backend` over them. Setup
/// waits at most [`DEFAULT_COLLECTIVE_TIMEOUT`] for the others.
///
/// ```
/// use tensorcomm::group::{init_process_group, Backend};
/// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// assert_eq!((pg.rank(), pg.size()), (0, 1));
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn init_process_group(backend: Backend, init_method: &str) -> Result<Arc<dyn ProcessGroup>> {
    let method = InitMethod::parse(init_method, |name| std::env::var(name).ok())?;
    let rdzv = rendezvous::connect(&method, DEFAULT_COLLECTIVE_TIMEOUT)?;
    let advertise_host = match &method.address {
        StoreAddress::Tcp { host, port } => local_address_towards(host, *port),
        StoreAddress::File { .. } => "127.0.0.1".to_string(),
    };
    match backend {
        Backend::Cpu => {
            let options = CpuOptions {
                advertise_host,
                ..CpuOptions::default()
            };
            let pg = ProcessGroupCpu::new(
                rdzv.store,
                "tensorcomm/pg/default",
                rdzv.rank,
                rdzv.world_size,
                &options,
            )?;
            Ok(Arc::new(pg))
        }
    }
}

/// The address of this host's interface that routes towards `host` (the
/// store's host), found without sending anything; loopback when `host` is
/// loopback or no route is found.
fn local_address_towards(host: &str, port: u16) -> String {
    let loopback = host == "localhost" || host.starts_with("127.") || host == "::1";
    if loopback {
        return "127.0.0.1".into();
    }
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let bind = if host.contains(':') {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    };
    UdpSocket::bind(bind)
        .and_then(|s| s.connect(&target).and_then(|()| s.local_addr()))
        .map_or_else(|_| "127.0.0.1".into(), |a| a.ip().to_string())
}
