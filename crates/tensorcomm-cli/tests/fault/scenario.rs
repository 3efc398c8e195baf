//! One fault-injection scenario, derived from a seed, a fault kind and the
//! backend so that the harness and every rank compute the same one: the
//! world size, the transport, the random sequence of collectives, the
//! victim rank, the step it fails at and how.

use std::fmt;
use std::str::FromStr;

use tensorcomm::tensor::DType;

/// What the victim rank does at its chosen step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// SIGKILLs itself, before the step's call or a moment inside it.
    Kill,
    /// Shuts down every socket it has (TCP transport), then carries on.
    CloseSockets,
    /// SIGSTOPs itself past the group's timeout.
    Stop,
    /// Exits 0 instead of calling the step's collective.
    ExitEarly,
    /// Calls another collective, or the same one with another shape or
    /// dtype.
    Mismatch,
    /// Rank 0, which hosts the rendezvous store, SIGKILLs itself while the
    /// others are still meeting through it: after a random delay, at the
    /// latest before the last barrier.
    StoreKill,
}

/// The backend the ranks of a scenario run their collectives on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultBackend {
    /// The CPU backend, host tensors (TCP or shared memory between ranks).
    Cpu,
    /// The NCCL backend, CUDA tensors, one GPU per rank (its local rank).
    Nccl,
}

impl fmt::Display for FaultBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultBackend::Cpu => "cpu",
            FaultBackend::Nccl => "nccl",
        })
    }
}

impl FromStr for FaultBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(FaultBackend::Cpu),
            "nccl" => Ok(FaultBackend::Nccl),
            other => Err(format!("unknown fault backend {other:?} (cpu or nccl)")),
        }
    }
}

impl FaultKind {
    /// The kinds whose every scenario holds today (the CI set); see
    /// `fault_injection.rs` for the cases still left out.
    pub const RELIABLE: [FaultKind; 6] = [
        FaultKind::Kill,
        FaultKind::CloseSockets,
        FaultKind::Stop,
        FaultKind::ExitEarly,
        FaultKind::Mismatch,
        FaultKind::StoreKill,
    ];

    /// The kinds run on the NCCL backend by default (see
    /// `fault_injection.rs` for what each expects there, and for why the
    /// others are left out).
    pub const NCCL_DEFAULT: [FaultKind; 4] = [
        FaultKind::Kill,
        FaultKind::Stop,
        FaultKind::ExitEarly,
        FaultKind::Mismatch,
    ];

    pub const ALL: [FaultKind; 6] = [
        FaultKind::Kill,
        FaultKind::CloseSockets,
        FaultKind::Stop,
        FaultKind::ExitEarly,
        FaultKind::Mismatch,
        FaultKind::StoreKill,
    ];

    /// A peer's connection drops: survivors must fail well before the
    /// timeout.
    pub fn drops_connection(self) -> bool {
        matches!(
            self,
            FaultKind::Kill | FaultKind::CloseSockets | FaultKind::ExitEarly | FaultKind::StoreKill
        )
    }

    /// Why this kind has no scenario on `backend`, if it has none.
    pub fn unsupported_on(self, backend: FaultBackend) -> Option<&'static str> {
        match (self, backend) {
            (FaultKind::CloseSockets, FaultBackend::Nccl) => Some(
                "NCCL moves a job's data between the GPUs of one host through peer memory and shared memory, not sockets: a rank whose sockets are shut may carry on and complete every collective, and whether anything fails at all depends on NCCL's own bootstrap and proxy sockets, so there is no expectation to check",
            ),
            _ => None,
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultKind::Kill => "kill",
            FaultKind::CloseSockets => "close-sockets",
            FaultKind::Stop => "stop",
            FaultKind::ExitEarly => "exit-early",
            FaultKind::Mismatch => "mismatch",
            FaultKind::StoreKill => "store-kill",
        })
    }
}

impl FromStr for FaultKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.to_string() == s)
            .ok_or_else(|| format!("unknown fault kind {s:?}"))
    }
}

/// A collective of the random sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    AllReduce,
    Broadcast { root: usize },
    AllGather,
    ReduceScatter,
    AllToAll,
    Barrier,
}

/// One step: the op, the dtype and the elements per rank's chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub op: Op,
    pub dtype: DType,
    pub numel: usize,
}

impl Step {
    /// Elements of each tensor the rank program passes for this step in a
    /// world of `world` ranks: all of `numel` for all_reduce and broadcast,
    /// one rank's chunk (`numel / world` rounded up, at least 1) for the
    /// collectives that take one tensor per rank, none for a barrier.
    pub fn tensor_numel(&self, world: usize) -> usize {
        match self.op {
            Op::AllReduce | Op::Broadcast { .. } => self.numel,
            Op::AllGather | Op::ReduceScatter | Op::AllToAll => self.numel.div_ceil(world).max(1),
            Op::Barrier => 0,
        }
    }

    /// What the library sees of this step: the op (with its root), and the
    /// dtype and length of its tensors (none for a barrier). Two steps with
    /// equal calls are the same collective call.
    pub fn call(&self, world: usize) -> (Op, Option<(DType, usize)>) {
        match self.op {
            Op::Barrier => (Op::Barrier, None),
            op => (op, Some((self.dtype, self.tensor_numel(world)))),
        }
    }
}

/// Everything a scenario is; equal on every rank and in the harness.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub kind: FaultKind,
    pub world: usize,
    pub backend: FaultBackend,
    /// `tcp` or `auto` (shared memory between these local ranks); `nccl`
    /// on the NCCL backend, which picks its own transports.
    pub transport: &'static str,
    pub steps: Vec<Step>,
    pub victim: usize,
    /// Whether rank 0 could have been drawn as the victim.
    pub victim_0: bool,
    /// The step at which the victim fails.
    pub fault_step: usize,
    /// Kill/Stop: microseconds inside the step's call before the signal
    /// (`None`: before the call). StoreKill: microseconds after start.
    pub delay_us: Option<u64>,
    /// Mismatch: the step the victim calls instead.
    pub wrong: Step,
}

/// splitmix64: a tiny, good-enough generator with no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::I32, DType::U8];

fn random_step(rng: &mut Rng, world: usize) -> Step {
    let op = match rng.below(6) {
        0 => Op::AllReduce,
        1 => Op::Broadcast {
            root: rng.below(world),
        },
        2 => Op::AllGather,
        3 => Op::ReduceScatter,
        4 => Op::AllToAll,
        _ => Op::Barrier,
    };
    let numel = match rng.below(4) {
        0 => 1 + rng.below(8),
        1 => 100 + rng.below(1000),
        2 => 10_000 + rng.below(20_000),
        _ => 100_000 + rng.below(150_000),
    };
    Step {
        op,
        dtype: DTYPES[rng.below(DTYPES.len())],
        numel,
    }
}

/// A step whose call differs from `step`'s in its op, its root, its dtype
/// or its tensors' length. Compared as [`Step::call`], not as steps: a new
/// `numel` that one rank's chunk rounds to the same length is no mismatch
/// (485 and 487 elements over 8 ranks are both chunks of 61).
///
/// On NCCL the mismatch must also make the call stall (which is when the
/// ranks compare their calls): NCCL runs two calls that move the same
/// bytes, such as f32 against i32 of one length, to completion with
/// garbage. So there the tensors' bytes must differ, and a barrier (one
/// element of at most 8 bytes) only meets a call of more than 8 bytes.
fn mismatched(rng: &mut Rng, step: Step, world: usize, backend: FaultBackend) -> Step {
    let bytes = |s: &Step| s.tensor_numel(world) * s.dtype.size();
    let stalls = |wrong: &Step| match (step.op, wrong.op) {
        (Op::Barrier, Op::Barrier) => false,
        (Op::Barrier, _) => bytes(wrong) > 8,
        (_, Op::Barrier) => bytes(&step) > 8,
        _ => bytes(wrong) != bytes(&step),
    };
    loop {
        let wrong = match rng.below(3) {
            0 => Step {
                numel: step.numel + 1 + rng.below(16),
                ..step
            },
            1 => Step {
                dtype: DTYPES[rng.below(DTYPES.len())],
                ..step
            },
            _ => random_step(rng, world),
        };
        if wrong.call(world) != step.call(world)
            && (backend != FaultBackend::Nccl || stalls(&wrong))
        {
            return wrong;
        }
    }
}

impl Scenario {
    /// A scenario on `backend` over `world` ranks when given (NCCL: one
    /// per GPU), else over the drawn world size. `victim_0`: whether rank
    /// 0 (the store's host) may be the victim of a fault other than
    /// [`FaultKind::StoreKill`].
    pub fn on(
        seed: u64,
        kind: FaultKind,
        victim_0: bool,
        backend: FaultBackend,
        world: Option<usize>,
    ) -> Self {
        let mut rng = Rng::new(seed);
        let drawn = 2 + rng.below(7);
        let world = world.unwrap_or(drawn);
        let transport = if kind == FaultKind::CloseSockets || rng.below(2) == 0 {
            "tcp"
        } else {
            "auto"
        };
        let transport = match backend {
            FaultBackend::Cpu => transport,
            FaultBackend::Nccl => "nccl",
        };
        let n = 2 + rng.below(6);
        let steps: Vec<Step> = (0..n).map(|_| random_step(&mut rng, world)).collect();
        let victim = if kind == FaultKind::StoreKill {
            0
        } else if victim_0 {
            rng.below(world)
        } else {
            1 + rng.below(world - 1)
        };
        let fault_step = rng.below(n);
        let delay_us = match kind {
            FaultKind::Kill | FaultKind::Stop => match rng.below(2) {
                0 => None,
                _ => Some(rng.next() % 3_000),
            },
            FaultKind::StoreKill => Some(rng.next() % 300_000),
            _ => None,
        };
        let wrong = mismatched(&mut rng, steps[fault_step], world, backend);
        Scenario {
            seed,
            kind,
            backend,
            world,
            transport,
            steps,
            victim,
            victim_0,
            fault_step,
            delay_us,
            wrong,
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed={:#018x} kind={} world={} transport={} victim={} step={}/{} delay_us={:?}",
            self.seed,
            self.kind,
            self.world,
            self.transport,
            self.victim,
            self.fault_step,
            self.steps.len(),
            self.delay_us
        )
    }
}
