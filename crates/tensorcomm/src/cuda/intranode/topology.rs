//! Whether a group's ranks can all-reduce through peer memory, as the
//! seed's IntraNodeComm decides it: 2 to 8 ranks, all on one host, GPUs of
//! compute capability 8.0 or newer, and (by default) distinct GPUs every
//! pair of which reaches the other over NVLink. The driver does not name
//! the link; a pair counts as NVLink when kernels can access each other's
//! memory with native atomics, which PCIe peers lack.
//!
//! Each rank publishes a [`RankInfo`] and judges the group from its own
//! process (only it can query its GPU's links); the ranks then agree on
//! the verdicts (see `symmetric_memory.rs`).

use crate::cuda::kernels::PEER_MAX;
use crate::cuda::runtime::{self, device_uuid, peer_link};
use crate::env_vars;
use crate::{Error, Result};

/// Which groups may use peer memory (`TENSORCOMM_INTRANODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerPolicy {
    /// Distinct GPUs of one host, every pair over NVLink.
    Auto,
    /// Also ranks sharing a GPU, and GPUs that are PCIe peers: for tests
    /// and development on one GPU.
    Shared,
    /// Never.
    Off,
}

impl PeerPolicy {
    /// Parses `TENSORCOMM_INTRANODE`'s value.
    ///
    /// ```
    /// use tensorcomm::cuda::intranode::PeerPolicy;
    /// assert_eq!(PeerPolicy::parse("shared")?, PeerPolicy::Shared);
    /// assert!(PeerPolicy::parse("yes").is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn parse(value: &str) -> Result<PeerPolicy> {
        Ok(match value.trim() {
            "" | "auto" => PeerPolicy::Auto,
            "shared" => PeerPolicy::Shared,
            "off" => PeerPolicy::Off,
            other => {
                return Err(Error::BadValue {
                    name: env_vars::INTRANODE.name.into(),
                    expected: "auto, shared or off".into(),
                    found: other.into(),
                })
            }
        })
    }

    /// From the environment (`auto` when unset).
    pub fn from_env() -> Result<PeerPolicy> {
        PeerPolicy::parse(&env_vars::INTRANODE.get().unwrap_or_default())
    }

    fn name(self) -> &'static str {
        match self {
            PeerPolicy::Auto => "auto",
            PeerPolicy::Shared => "shared",
            PeerPolicy::Off => "off",
        }
    }
}

/// What one rank tells the others at set-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RankInfo {
    pub(crate) host: String,
    /// For messages only: pids repeat across containers.
    pub(crate) pid: u32,
    /// A random number drawn once per process: equal only for ranks of
    /// one process.
    pub(crate) process: u64,
    pub(crate) uuid: [u8; 16],
    pub(crate) capability: (i32, i32),
    /// Settings every rank must share, as `name=value` words.
    pub(crate) settings: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

pub(crate) fn to_hex(bytes: &[u8]) -> String {
    hex(bytes)
}

impl RankInfo {
    /// This process's info for GPU `device`.
    pub(crate) fn mine(device: usize, settings: String) -> Result<RankInfo> {
        let ctx = runtime::context(device)?;
        Ok(RankInfo {
            host: crate::cpu::transport::host_identity(),
            pid: std::process::id(),
            process: process_nonce(),
            uuid: device_uuid(device)?,
            capability: ctx.capability(),
            settings,
        })
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "{}\n{} {:016x}\n{}\n{}.{}\n{}",
            self.host,
            self.pid,
            self.process,
            hex(&self.uuid),
            self.capability.0,
            self.capability.1,
            self.settings
        )
        .into_bytes()
    }

    /// Rank `rank`'s info from what it posted; a rank that failed before
    /// it could describe itself posted `error: <why>` instead, which comes
    /// back as an error naming it and its reason.
    pub(crate) fn decode(rank: usize, bytes: &[u8]) -> Result<RankInfo> {
        if let Some(why) = bytes.strip_prefix(b"error: ") {
            return Err(Error::PeerProtocol {
                peer: rank,
                expected: "its intra-node set-up info; it failed to set up".into(),
                found: String::from_utf8_lossy(why).into_owned(),
            });
        }
        let bad = || Error::PeerProtocol {
            peer: rank,
            expected:
                "intra-node set-up info (host, pid and process, GPU UUID, capability, settings)"
                    .into(),
            found: format!("{:?}", String::from_utf8_lossy(bytes)),
        };
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        let lines: Vec<&str> = text.splitn(5, '\n').collect();
        let [host, pid, uuid, cap, settings] = lines[..] else {
            return Err(bad());
        };
        let (major, minor) = cap.split_once('.').ok_or_else(bad)?;
        let (pid, process) = pid.split_once(' ').ok_or_else(bad)?;
        Ok(RankInfo {
            host: host.into(),
            pid: pid.parse().map_err(|_| bad())?,
            process: u64::from_str_radix(process, 16).map_err(|_| bad())?,
            uuid: unhex(uuid).ok_or_else(bad)?,
            capability: (
                major.parse().map_err(|_| bad())?,
                minor.parse().map_err(|_| bad())?,
            ),
            settings: settings.into(),
        })
    }
}

/// This process's random number (see [`RankInfo::process`]): std's
/// `RandomState` keys come from the OS's random source.
fn process_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NONCE.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    })
}

/// The settings every rank must share, as one line.
pub(crate) fn settings_line(policy: PeerPolicy, algo: &str, region: usize) -> String {
    format!(
        "{}={} {}={algo} region={region}",
        env_vars::INTRANODE.name,
        policy.name(),
        env_vars::INTRANODE_ALGO.name
    )
}

/// The visible GPU with `uuid`, if any.
fn visible_device(uuid: &[u8; 16]) -> Result<Option<usize>> {
    for d in 0..runtime::device_count()? {
        if &device_uuid(d)? == uuid {
            return Ok(Some(d));
        }
    }
    Ok(None)
}

/// Why this rank (`me`, on GPU `device`) cannot all-reduce through peer
/// memory with the ranks `infos` describe, or `Ok(None)` when it can.
/// Errors are CUDA failures while asking.
pub(crate) fn why_not(
    me: usize,
    device: usize,
    infos: &[RankInfo],
    policy: PeerPolicy,
) -> Result<Option<String>> {
    let world = infos.len();
    if policy == PeerPolicy::Off {
        return Ok(Some(format!("{}=off", env_vars::INTRANODE.name)));
    }
    if !(2..=PEER_MAX).contains(&world) {
        return Ok(Some(format!(
            "a group of {world}: peer memory serves 2 to {PEER_MAX} ranks"
        )));
    }
    let mine = &infos[me];
    if let Some((r, other)) = infos
        .iter()
        .enumerate()
        .find(|(_, i)| i.settings != mine.settings)
    {
        return Err(Error::InvalidArgument(format!(
            "intra-node settings differ between ranks: rank {me} has {:?}, rank {r} has {:?}; every rank must set the same",
            mine.settings, other.settings
        )));
    }
    if let Some((r, other)) = infos.iter().enumerate().find(|(_, i)| i.host != mine.host) {
        return Ok(Some(format!(
            "rank {r} is on another host ({}) than rank {me} ({})",
            other.host, mine.host
        )));
    }
    if mine.capability < (8, 0) {
        return Ok(Some(format!(
            "cuda:{device} has compute capability {}.{}, below 8.0",
            mine.capability.0, mine.capability.1
        )));
    }
    for (r, other) in infos.iter().enumerate() {
        if r == me {
            continue;
        }
        if other.uuid == mine.uuid {
            if policy == PeerPolicy::Auto {
                return Ok(Some(format!(
                    "ranks {me} and {r} share one GPU ({}=shared allows it)",
                    env_vars::INTRANODE.name
                )));
            }
            continue;
        }
        if other.process == mine.process && policy == PeerPolicy::Auto {
            // Seen on two H200s: a rank dropping a sub-group freed a peer's
            // block, the free waited for that peer's GPU, whose kernel
            // waited for a kernel this process could not launch meanwhile.
            return Ok(Some(format!(
                "ranks {me} and {r} are threads of one process on distinct GPUs, where freeing one rank's peer memory can wait on another rank's kernel ({}=shared allows it)",
                env_vars::INTRANODE.name
            )));
        }
        let Some(theirs) = visible_device(&other.uuid)? else {
            return Ok(Some(format!(
                "the GPU of rank {r} is not visible to rank {me} (CUDA_VISIBLE_DEVICES)"
            )));
        };
        let link = peer_link(device, theirs)?;
        if !link.access {
            return Ok(Some(format!(
                "cuda:{device} (rank {me}) cannot access the memory of cuda:{theirs} (rank {r})"
            )));
        }
        if !link.native_atomics && policy == PeerPolicy::Auto {
            return Ok(Some(format!(
                "cuda:{device} (rank {me}) reaches cuda:{theirs} (rank {r}) without native atomics: not NVLink"
            )));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(host: &str, uuid: u8) -> RankInfo {
        RankInfo {
            host: host.into(),
            pid: 7,
            process: 0x1234,
            uuid: [uuid; 16],
            capability: (9, 0),
            settings: settings_line(PeerPolicy::Auto, "auto", 1 << 20),
        }
    }

    #[test]
    fn ranks_of_one_process_on_distinct_gpus_are_refused_by_default() {
        // Two ranks of one process (the same process number), GPUs 1 and 2.
        let infos = [info("h", 1), info("h", 2)];
        let why = why_not(0, 0, &infos, PeerPolicy::Auto).unwrap().unwrap();
        assert!(
            why.contains("ranks 0 and 1 are threads of one process"),
            "{why}"
        );
        assert!(why.contains("TENSORCOMM_INTRANODE=shared"), "{why}");
    }

    #[test]
    fn info_round_trips_and_garbage_names_the_rank() {
        let i = info("host=a boot=b shm=3", 5);
        assert_eq!(RankInfo::decode(1, &i.encode()).unwrap(), i);
        let e = RankInfo::decode(3, b"nonsense").unwrap_err().to_string();
        assert!(e.contains("rank 3") && e.contains("intra-node"), "{e}");
        // A rank that failed before set-up posted its error instead.
        let e = RankInfo::decode(2, b"error: no GPU cuda:9")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 2") && e.contains("no GPU cuda:9"), "{e}");
        // The older form, a pid without the process number, is refused.
        let text = String::from_utf8(i.encode()).unwrap();
        let old = text.replace("\n7 0000000000001234\n", "\n7\n");
        assert_ne!(old, text);
        assert!(RankInfo::decode(1, old.as_bytes()).is_err());
    }

    #[test]
    fn the_process_number_is_one_per_process() {
        assert_eq!(process_nonce(), process_nonce());
        let other = std::thread::spawn(process_nonce).join().unwrap();
        assert_eq!(other, process_nonce());
        let i = info("a", 1);
        let mut j = i.clone();
        j.process = u64::MAX;
        let back = RankInfo::decode(0, &j.encode()).unwrap();
        assert_eq!(back.process, u64::MAX);
        assert_ne!(back, i);
    }

    #[test]
    fn groups_are_refused_before_any_gpu_is_asked() {
        // These verdicts come from the infos alone (no CUDA call).
        let two = [info("a", 1), info("a", 2)];
        let off = why_not(0, 0, &two, PeerPolicy::Off).unwrap().unwrap();
        assert!(off.contains("TENSORCOMM_INTRANODE=off"), "{off}");
        let one = why_not(0, 0, &two[..1], PeerPolicy::Auto).unwrap().unwrap();
        assert!(one.contains("a group of 1"), "{one}");
        let nine: Vec<_> = (0..9).map(|i| info("a", i)).collect();
        let many = why_not(0, 0, &nine, PeerPolicy::Auto).unwrap().unwrap();
        assert!(many.contains("a group of 9"), "{many}");
        let hosts = [info("a", 1), info("b", 2)];
        let apart = why_not(0, 0, &hosts, PeerPolicy::Auto).unwrap().unwrap();
        assert!(apart.contains("rank 1 is on another host"), "{apart}");
        let mut old = [info("a", 1), info("a", 2)];
        old[0].capability = (7, 5);
        let cap = why_not(0, 0, &old, PeerPolicy::Auto).unwrap().unwrap();
        assert!(cap.contains("7.5"), "{cap}");
        let shared = [info("a", 1), info("a", 1)];
        let same = why_not(0, 0, &shared, PeerPolicy::Auto).unwrap().unwrap();
        assert!(same.contains("share one GPU"), "{same}");
        let mut differ = [info("a", 1), info("a", 2)];
        differ[1].settings = settings_line(PeerPolicy::Shared, "auto", 1 << 20);
        let e = why_not(0, 0, &differ, PeerPolicy::Auto)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 1") && e.contains("shared"), "{e}");
    }

    #[test]
    fn the_policy_parses_and_names_the_variable() {
        assert_eq!(PeerPolicy::parse("").unwrap(), PeerPolicy::Auto);
        assert_eq!(PeerPolicy::parse("off").unwrap(), PeerPolicy::Off);
        let e = PeerPolicy::parse("on").unwrap_err().to_string();
        assert!(
            e.contains("TENSORCOMM_INTRANODE") && e.contains("shared"),
            "{e}"
        );
    }
}
