//! Collective fingerprints: what a rank believes the current collective is,
//! carried in front of the first message it sends to each peer and checked
//! by the receiver, so mismatched collectives are reported (with both
//! sides' fingerprints) instead of exchanging garbage or hanging.

use std::fmt;

use super::ReduceOp;
use crate::tensor::DType;

/// Bytes of an encoded fingerprint.
pub(crate) const FINGERPRINT_LEN: usize = 32;

/// Which collective a fingerprint describes.
///
/// What each kind's fingerprint covers is said in `group/collective.rs`
/// (for uneven `all_to_all` and `all_to_all_single` only what every rank
/// shares).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CollectiveKind {
    AllReduce = 1,
    Broadcast = 2,
    Barrier = 3,
    Reduce = 20,
    AllGather = 21,
    AllGatherIntoTensor = 22,
    AllGatherCoalesced = 23,
    Gather = 24,
    Scatter = 25,
    ReduceScatter = 26,
    ReduceScatterTensor = 27,
    AllToAll = 28,
    AllToAllSingle = 29,
    AllReduceCoalesced = 30,
    AllGatherIntoTensorCoalesced = 31,
    ReduceScatterTensorCoalesced = 32,
    MonitoredBarrier = 64,
    AllReduceSparse = 65,
}

impl CollectiveKind {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Barrier => "barrier",
            CollectiveKind::Reduce => "reduce",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::AllGatherIntoTensor => "all_gather_into_tensor",
            CollectiveKind::AllGatherCoalesced => "all_gather_coalesced",
            CollectiveKind::Gather => "gather",
            CollectiveKind::Scatter => "scatter",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::ReduceScatterTensor => "reduce_scatter_tensor",
            CollectiveKind::AllToAll => "all_to_all",
            CollectiveKind::AllToAllSingle => "all_to_all_single",
            CollectiveKind::AllReduceCoalesced => "all_reduce_coalesced",
            CollectiveKind::AllGatherIntoTensorCoalesced => "all_gather_into_tensor_coalesced",
            CollectiveKind::ReduceScatterTensorCoalesced => "reduce_scatter_tensor_coalesced",
            CollectiveKind::MonitoredBarrier => "monitored_barrier",
            CollectiveKind::AllReduceSparse => "all_reduce_sparse",
        }
    }

    /// True for collectives whose `root` field is a root rank.
    const fn has_root(self) -> bool {
        matches!(
            self,
            CollectiveKind::Broadcast
                | CollectiveKind::Reduce
                | CollectiveKind::Gather
                | CollectiveKind::Scatter
        )
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => CollectiveKind::AllReduce,
            2 => CollectiveKind::Broadcast,
            3 => CollectiveKind::Barrier,
            20 => CollectiveKind::Reduce,
            21 => CollectiveKind::AllGather,
            22 => CollectiveKind::AllGatherIntoTensor,
            23 => CollectiveKind::AllGatherCoalesced,
            24 => CollectiveKind::Gather,
            25 => CollectiveKind::Scatter,
            26 => CollectiveKind::ReduceScatter,
            27 => CollectiveKind::ReduceScatterTensor,
            28 => CollectiveKind::AllToAll,
            29 => CollectiveKind::AllToAllSingle,
            30 => CollectiveKind::AllReduceCoalesced,
            31 => CollectiveKind::AllGatherIntoTensorCoalesced,
            32 => CollectiveKind::ReduceScatterTensorCoalesced,
            64 => CollectiveKind::MonitoredBarrier,
            65 => CollectiveKind::AllReduceSparse,
            _ => return None,
        })
    }
}

/// A collective as one rank sees it: op, reduce op, dtype, element count,
/// a hash of shape and strides, root and sequence number. `root` is the
/// root rank of rooted collectives; for `all_to_all_single` it is 1 when
/// the splits are uneven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    pub(crate) kind: CollectiveKind,
    pub(crate) reduce_op: u8,
    pub(crate) dtype: Option<DType>,
    pub(crate) root: u32,
    pub(crate) seq: u64,
    pub(crate) numel: u64,
    pub(crate) shape_hash: u64,
}

fn dtype_code(dtype: Option<DType>) -> u8 {
    dtype.map_or(0, |d| {
        DType::ALL
            .iter()
            .position(|&x| x == d)
            .map_or(0, |i| i as u8 + 1)
    })
}

/// FNV-1a over shape and strides.
pub(crate) fn shape_hash(shape: &[usize], strides: &[usize]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in shape.iter().chain([&usize::MAX]).chain(strides) {
        for b in (*v as u64).to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The reduce-op code of a fingerprint (0 for collectives without one).
pub(crate) fn reduce_code(op: Option<ReduceOp>) -> u8 {
    match op {
        None => 0,
        Some(ReduceOp::Sum) => 1,
        Some(ReduceOp::Avg) => 2,
        Some(ReduceOp::Product) => 3,
        Some(ReduceOp::Min) => 4,
        Some(ReduceOp::Max) => 5,
        Some(ReduceOp::Band) => 6,
        Some(ReduceOp::Bor) => 7,
        Some(ReduceOp::Bxor) => 8,
        Some(ReduceOp::PremulSum(_)) => 9,
    }
}

const REDUCE_NAMES: [&str; 10] = [
    "-",
    "SUM",
    "AVG",
    "PRODUCT",
    "MIN",
    "MAX",
    "BAND",
    "BOR",
    "BXOR",
    "PREMUL_SUM",
];

/// The c10d name of a fingerprint's reduce-op code (`None` for 0, "no
/// reduce op", and for unknown codes).
pub(crate) fn reduce_name(code: u8) -> Option<&'static str> {
    REDUCE_NAMES
        .get(usize::from(code))
        .filter(|_| code != 0)
        .copied()
}

impl Fingerprint {
    pub(crate) fn encode(&self) -> [u8; FINGERPRINT_LEN] {
        let mut out = [0u8; FINGERPRINT_LEN];
        out[0] = self.kind as u8;
        out[1] = self.reduce_op;
        out[2] = dtype_code(self.dtype);
        out[4..8].copy_from_slice(&self.root.to_le_bytes());
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..24].copy_from_slice(&self.numel.to_le_bytes());
        out[24..32].copy_from_slice(&self.shape_hash.to_le_bytes());
        out
    }

    /// Decodes a peer's fingerprint; `None` when the bytes are not one.
    pub(crate) fn decode(bytes: &[u8; FINGERPRINT_LEN]) -> Option<Self> {
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let dtype = match bytes[2] {
            0 => None,
            c => Some(*DType::ALL.get(usize::from(c) - 1)?),
        };
        if usize::from(bytes[1]) >= REDUCE_NAMES.len() || bytes[3] != 0 {
            return None;
        }
        Some(Fingerprint {
            kind: CollectiveKind::from_code(bytes[0])?,
            reduce_op: bytes[1],
            dtype,
            root: u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
            seq: u64_at(8),
            numel: u64_at(16),
            shape_hash: u64_at(24),
        })
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (seq {}", self.kind.name(), self.seq)?;
        if self.reduce_op != 0 {
            write!(f, ", {}", REDUCE_NAMES[usize::from(self.reduce_op)])?;
        }
        if let Some(dtype) = self.dtype {
            write!(
                f,
                ", {dtype}, {} elements, shape/strides hash {:#018x}",
                self.numel, self.shape_hash
            )?;
        }
        if self.kind.has_root() {
            write!(f, ", root {}", self.root)?;
        }
        if self.kind == CollectiveKind::AllToAllSingle && self.root != 0 {
            f.write_str(", uneven splits")?;
        }
        f.write_str(")")
    }
}
