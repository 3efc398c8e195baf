//! Init method URLs and the environment `env://` reads. The input is
//! split into pieces: a URL, then (name, value) pairs; names are drawn
//! from the variables `env://` reads, so the fuzzer reaches their parsing.
//! Checked: no panic, and a parsed method is consistent (rank below world
//! size, a non-empty host or path).

use super::input::Input;
use crate::rendezvous::{InitMethod, StoreAddress};

const VARS: &[&str] = &[
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
];

pub fn init_method(data: &[u8]) {
    let mut input = Input(data);
    let url = String::from_utf8_lossy(input.piece()).into_owned();
    let mut env: Vec<(&str, String)> = Vec::new();
    while !input.is_empty() {
        let name = VARS[usize::from(input.u8()) % VARS.len()];
        env.push((name, String::from_utf8_lossy(input.piece()).into_owned()));
    }
    let lookup = |name: &str| env.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
    for url in [url.clone(), format!("env://{url}"), format!("tcp://{url}")] {
        if let Ok(m) = InitMethod::parse(&url, lookup) {
            assert!(m.rank < m.world_size, "{url}: {m:?}");
            match &m.address {
                StoreAddress::Tcp { host, .. } => assert!(!host.is_empty(), "{url}: {m:?}"),
                StoreAddress::File { path } => {
                    assert!(!path.as_os_str().is_empty(), "{url}: {m:?}")
                }
            }
        }
    }
}
