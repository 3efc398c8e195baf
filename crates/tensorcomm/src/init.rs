//! Starting a job's process groups, above every backend: meet the other
//! ranks through an init method and build the default group of the chosen
//! [`Backend`] (c10d's `init_process_group`), with c10d's options.

use std::net::UdpSocket;
use std::sync::Arc;
use std::time::Duration;

use crate::auto_group::AutoGroup;
use crate::cpu::backend::{CpuOptions, ProcessGroupCpu};
use crate::cpu::transport::TransportChoice;
#[cfg(feature = "cuda")]
use crate::cuda::nccl::{NcclOptions, ProcessGroupNccl};
use crate::group::{Backend, ProcessGroup, DEFAULT_COLLECTIVE_TIMEOUT};
use crate::rendezvous::{self, InitMethod, StoreAddress};
use crate::Result;

/// How [`init_process_group_with`] sets up the default group.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// The default timeout of every collective of the group (and of its
    /// setup): c10d's `timeout`.
    pub timeout: Duration,
    /// The group's name, which namespaces its keys in the store: c10d's
    /// `group_name`. Two default groups in one job need two names.
    pub group_name: String,
    /// Which transport the CPU backend uses between ranks.
    pub transport: TransportChoice,
    /// The GPU of this rank for the NCCL backend (c10d's `device_id`), and
    /// for the CPU backend's peer memory; `None`: `LOCAL_RANK` modulo the
    /// GPU count.
    pub device: Option<usize>,
    /// CPU backend: set up the device path for CUDA tensors on this rank's
    /// GPU (see [`CpuOptions::peer_memory`]), with the peer-memory
    /// settings of the environment (`TENSORCOMM_INTRANODE`, ...).
    #[cfg(feature = "cuda")]
    pub peer_memory: bool,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            timeout: DEFAULT_COLLECTIVE_TIMEOUT,
            group_name: "default".into(),
            transport: TransportChoice::default(),
            device: None,
            #[cfg(feature = "cuda")]
            peer_memory: false,
        }
    }
}

/// Meets the other ranks through `init_method` (`env://`,
/// `tcp://host:port?rank=R&world_size=W`, `file:///path?rank=R&world_size=W`)
/// and builds the default process group of `backend` over them, with
/// [`InitOptions::default`]: collectives and setup time out after
/// [`DEFAULT_COLLECTIVE_TIMEOUT`].
///
/// ```
/// use tensorcomm::{init_process_group, Backend};
/// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// assert_eq!((pg.rank(), pg.size()), (0, 1));
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn init_process_group(backend: Backend, init_method: &str) -> Result<Arc<dyn ProcessGroup>> {
    init_process_group_with(backend, init_method, &InitOptions::default())
}

/// [`init_process_group`] with `options`. `backend` may also be given by
/// its c10d name (`"gloo"`, `"cpu"`), parsed with [`str::parse`].
///
/// ```
/// use std::time::Duration;
/// use tensorcomm::{init_process_group_with, Backend, InitOptions};
///
/// let options = InitOptions {
///     timeout: Duration::from_secs(60),
///     group_name: "trainer".into(),
///     ..InitOptions::default()
/// };
/// let backend: Backend = "gloo".parse()?;
/// let pg = init_process_group_with(backend, "tcp://127.0.0.1:0?rank=0&world_size=1", &options)?;
/// assert_eq!(pg.backend(), Backend::Cpu);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn init_process_group_with(
    backend: Backend,
    init_method: &str,
    options: &InitOptions,
) -> Result<Arc<dyn ProcessGroup>> {
    let method = InitMethod::parse(init_method, |name| std::env::var(name).ok())?;
    let rank0_hosts_store = matches!(method.address, StoreAddress::Tcp { .. });
    set_up(backend, &method, options).map_err(|e| match e {
        // With env:// and tcp:// rank 0 hosts the store: losing it during
        // set-up means rank 0 is gone, so say so.
        crate::Error::StoreConnectionLost { addr, reason } if rank0_hosts_store => {
            crate::Error::PeerClosed {
                peer: 0,
                during: format!(
                    "setting up group {:?} (rank {} of {})",
                    options.group_name, method.rank, method.world_size
                ),
                reason: format!(
                    "the connection to the TCP store rank 0 hosts at {addr} was lost ({reason})"
                ),
            }
        }
        other => other,
    })
}

/// Rendezvous, then the default group of `backend`.
fn set_up(
    backend: Backend,
    method: &InitMethod,
    options: &InitOptions,
) -> Result<Arc<dyn ProcessGroup>> {
    let rdzv = rendezvous::connect(method, options.timeout)?;
    let advertise_host = match &method.address {
        StoreAddress::Tcp { host, port } => local_address_towards(host, *port),
        StoreAddress::File { .. } => "127.0.0.1".to_string(),
    };
    let key_prefix = format!("tensorcomm/pg/{}", options.group_name);
    let cpu = CpuOptions {
        advertise_host,
        timeout: options.timeout,
        transport: options.transport,
        #[cfg(feature = "cuda")]
        peer_memory: if options.peer_memory {
            Some(crate::cpu::backend::PeerMemory {
                device: match options.device {
                    Some(d) => d,
                    None => local_gpu(rdzv.local_rank.unwrap_or(rdzv.rank))?,
                },
                options: crate::cuda::intranode::IntraNodeOptions {
                    timeout: options.timeout,
                    ..Default::default()
                },
            })
        } else {
            None
        },
        ..CpuOptions::default()
    };
    // With env:// and tcp:// rank 0 hosts the store.
    let store_host = matches!(method.address, StoreAddress::Tcp { .. }).then_some(0);
    let (store, rank) = (rdzv.store.clone(), rdzv.rank);
    build(backend, rdzv, &key_prefix, &cpu, options, store_host).map_err(|e| match store_host {
        // A peer lost while the store's host is gone too: the host's loss.
        Some(host) => crate::group::failure_report::set_up_error(&store, rank, host, e),
        None => e,
    })
}

/// The default group of `backend` over `rdzv`; `store_host`: the rank that
/// hosts the store, if one does.
fn build(
    backend: Backend,
    rdzv: rendezvous::Rendezvous,
    key_prefix: &str,
    cpu: &CpuOptions,
    options: &InitOptions,
    store_host: Option<usize>,
) -> Result<Arc<dyn ProcessGroup>> {
    let cpu_group = |store, rank, size| -> Result<ProcessGroupCpu> {
        let pg = ProcessGroupCpu::new(store, key_prefix, rank, size, cpu)?;
        if let Some(host) = store_host {
            pg.set_store_host(host);
        }
        Ok(pg)
    };
    match backend {
        Backend::Cpu => Ok(Arc::new(cpu_group(rdzv.store, rdzv.rank, rdzv.world_size)?)),
        Backend::Auto => {
            let store = rdzv.store.clone();
            let (rank, size) = (rdzv.rank, rdzv.world_size);
            let host: Arc<dyn ProcessGroup> = Arc::new(cpu_group(store.clone(), rank, size)?);
            let cuda = cuda_half(&host, store, &format!("{key_prefix}/cuda"), options)?;
            Ok(Arc::new(AutoGroup::new(host, cuda)))
        }
        #[cfg(feature = "cuda")]
        Backend::Nccl => {
            let nccl = NcclOptions {
                timeout: options.timeout,
                device: options.device,
            };
            let pg =
                ProcessGroupNccl::new(rdzv.store, key_prefix, rdzv.rank, rdzv.world_size, &nccl)?;
            Ok(Arc::new(pg))
        }
        #[cfg(not(feature = "cuda"))]
        Backend::Nccl => Err(crate::Error::NoCuda {
            reason: "tensorcomm was built without its `cuda` feature".into(),
        }),
    }
}

/// The NCCL half of a [`Backend::Auto`] group, when every rank can run
/// NCCL (agreed through `host`, the CPU half), else why not.
fn cuda_half(
    host: &Arc<dyn ProcessGroup>,
    store: Arc<dyn crate::store::Store>,
    key_prefix: &str,
    options: &InitOptions,
) -> Result<std::result::Result<Arc<dyn ProcessGroup>, String>> {
    #[cfg(feature = "cuda")]
    let mine: std::result::Result<(), String> = crate::cuda::runtime::device_count()
        .and_then(|n| match n {
            0 => Err(crate::Error::NoCuda {
                reason: "no GPU".into(),
            }),
            _ => crate::cuda::nccl::version().map(|_| ()),
        })
        .map_err(|e| e.to_string());
    #[cfg(not(feature = "cuda"))]
    let mine: std::result::Result<(), String> =
        Err("tensorcomm was built without its `cuda` feature".into());
    let flag = crate::tensor::Tensor::from_vec(vec![i32::from(mine.is_ok())], &[1])?;
    host.all_reduce(&flag, crate::ReduceOp::Min, Some(options.timeout))?
        .wait()?;
    if flag.to_vec::<i32>()?[0] == 0 {
        return Ok(Err(mine.err().unwrap_or_else(|| {
            "another rank of the group cannot run NCCL (no GPU or no libnccl there)".into()
        })));
    }
    #[cfg(feature = "cuda")]
    {
        let nccl = NcclOptions {
            timeout: options.timeout,
            device: options.device,
        };
        let pg = ProcessGroupNccl::new(store, key_prefix, host.rank(), host.size(), &nccl)?;
        Ok(Ok(Arc::new(pg)))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (store, key_prefix);
        unreachable!("every rank agreed it can run NCCL")
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
    let target = rendezvous::host_port(host, port);
    let bind = if host.contains(':') {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    };
    UdpSocket::bind(bind)
        .and_then(|s| s.connect(&target).and_then(|()| s.local_addr()))
        .map_or_else(|_| "127.0.0.1".into(), |a| a.ip().to_string())
}

/// The GPU of local rank `local`: `local` modulo the GPU count.
#[cfg(feature = "cuda")]
fn local_gpu(local: usize) -> Result<usize> {
    let count = crate::cuda::runtime::device_count()?;
    if count == 0 {
        return Err(crate::Error::NoCuda {
            reason: "peer memory needs a GPU and this machine has none".into(),
        });
    }
    Ok(local % count)
}
