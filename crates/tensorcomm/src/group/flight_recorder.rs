//! The flight recorder: the last N collectives of a group (op, sequence
//! number, element count, dtype, reduce op, root, peers, state and timings),
//! kept in a ring so that after a failure or a hang one can see what each
//! rank was doing, like PyTorch's NCCL flight recorder.
//!
//! `N` is 64 unless `TENSORCOMM_FLIGHT_RECORDER_SIZE` says otherwise (0
//! turns recording off). The record is dumped as JSON on request
//! ([`ProcessGroup::flight_recorder_json`](super::ProcessGroup::flight_recorder_json))
//! and automatically when a collective fails or times out: into a file in
//! `TENSORCOMM_FLIGHT_RECORDER_DIR` when that is set, to stderr otherwise.
//!
//! ```
//! use tensorcomm::{init_process_group, Backend, ReduceOp};
//! use tensorcomm::tensor::Tensor;
//!
//! let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
//! pg.all_reduce(&Tensor::from_vec(vec![1.0f32; 3], &[3])?, ReduceOp::Sum, None)?.wait()?;
//! let json = pg.flight_recorder_json();
//! assert!(json.contains(r#""op":"all_reduce","seq":0,"state":"completed""#), "{json}");
//! # Ok::<(), tensorcomm::Error>(())
//! ```

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::fingerprint::{reduce_name, Fingerprint};
use crate::{Error, Result};

/// Entries kept unless `TENSORCOMM_FLIGHT_RECORDER_SIZE` says otherwise.
pub const DEFAULT_FLIGHT_RECORDER_SIZE: usize = 64;
/// Environment variable: how many collectives to keep.
pub const FLIGHT_RECORDER_SIZE_ENV: &str = "TENSORCOMM_FLIGHT_RECORDER_SIZE";
/// Environment variable: where to write dumps on failure (stderr if unset).
pub const FLIGHT_RECORDER_DIR_ENV: &str = "TENSORCOMM_FLIGHT_RECORDER_DIR";

/// Where a collective is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Queued,
    Started,
    Completed,
    Failed,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Started => "started",
            State::Completed => "completed",
            State::Failed => "failed",
        }
    }
}

struct Entry {
    fp: Fingerprint,
    state: State,
    queued_unix_us: u128,
    queued: Instant,
    started: Option<Instant>,
    finished: Option<Instant>,
    error: Option<String>,
}

/// The last collectives of one rank of one group.
pub(crate) struct FlightRecorder {
    capacity: usize,
    rank: usize,
    size: usize,
    group: String,
    entries: Mutex<VecDeque<Entry>>,
}

impl FlightRecorder {
    /// A recorder of `capacity` entries for rank `rank` of `size` in the
    /// group named `group`.
    pub(crate) fn new(capacity: usize, rank: usize, size: usize, group: &str) -> Self {
        FlightRecorder {
            capacity,
            rank,
            size,
            group: group.into(),
            entries: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
        }
    }

    /// A recorder sized by `TENSORCOMM_FLIGHT_RECORDER_SIZE`.
    pub(crate) fn from_env(rank: usize, size: usize, group: &str) -> Result<Self> {
        let capacity = match std::env::var(FLIGHT_RECORDER_SIZE_ENV) {
            Err(_) => DEFAULT_FLIGHT_RECORDER_SIZE,
            Ok(v) => v.trim().parse().map_err(|_| Error::BadValue {
                name: FLIGHT_RECORDER_SIZE_ENV.into(),
                expected: "a number of collectives to keep (0 turns recording off)".into(),
                found: v.clone(),
            })?,
        };
        Ok(FlightRecorder::new(capacity, rank, size, group))
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a collective taking its sequence number.
    pub(crate) fn queued(&self, fp: &Fingerprint) {
        if self.capacity == 0 {
            return;
        }
        let mut entries = self.lock();
        if entries.len() == self.capacity {
            entries.pop_front();
        }
        entries.push_back(Entry {
            fp: *fp,
            state: State::Queued,
            queued_unix_us: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros()),
            queued: Instant::now(),
            started: None,
            finished: None,
            error: None,
        });
    }

    fn update(&self, seq: u64, f: impl FnOnce(&mut Entry)) {
        if let Some(e) = self.lock().iter_mut().rev().find(|e| e.fp.seq == seq) {
            f(e);
        }
    }

    /// Records that collective `seq` started running.
    pub(crate) fn started(&self, seq: u64) {
        self.update(seq, |e| {
            e.state = State::Started;
            e.started = Some(Instant::now());
        });
    }

    /// Records how collective `seq` ended; when it ran and failed, dumps
    /// the record (see the module documentation).
    pub(crate) fn finished(&self, seq: u64, outcome: &Result<()>) {
        let mut ran = false;
        self.update(seq, |e| {
            ran = e.started.is_some();
            e.finished = Some(Instant::now());
            match outcome {
                Ok(()) => e.state = State::Completed,
                Err(err) => {
                    e.state = State::Failed;
                    e.error = Some(err.to_string());
                }
            }
        });
        // A call failed by its own process's exit (`process_exit.rs`) is
        // not a failure worth a dump.
        if ran && outcome.is_err() && !crate::process_exit::exiting() {
            let dir = std::env::var_os(FLIGHT_RECORDER_DIR_ENV).map(PathBuf::from);
            if let Err(e) = self.dump(dir.as_deref()) {
                tracing::warn!(error = %e, "could not write the flight recorder dump");
            }
        }
    }

    /// Writes the record as JSON into a file in `dir` (returning its path),
    /// or to stderr when `dir` is `None`.
    pub(crate) fn dump(&self, dir: Option<&Path>) -> Result<Option<PathBuf>> {
        let json = self.to_json();
        let Some(dir) = dir else {
            eprintln!("tensorcomm flight recorder (rank {}): {json}", self.rank);
            return Ok(None);
        };
        let group: String = self
            .group
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = dir.join(format!(
            "tensorcomm_flight_recorder_{group}_rank{}_pid{}.json",
            self.rank,
            std::process::id()
        ));
        std::fs::write(&path, json).map_err(|e| {
            Error::io(
                format!("writing the flight recorder to {}", path.display()),
                e,
            )
        })?;
        Ok(Some(path))
    }

    /// The record as a JSON object: the group, this rank, and the entries
    /// oldest first.
    pub(crate) fn to_json(&self) -> String {
        let mut out = String::new();
        let _ = write!(
            out,
            r#"{{"group":{},"rank":{},"world_size":{},"capacity":{},"entries":["#,
            json_string(&self.group),
            self.rank,
            self.size,
            self.capacity
        );
        for (i, e) in self.lock().iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let us = |a: Instant, b: Option<Instant>| {
                b.map_or("null".to_string(), |b| {
                    b.duration_since(a).as_micros().to_string()
                })
            };
            let peers: Vec<String> = (0..self.size)
                .filter(|&p| p != self.rank)
                .map(|p| p.to_string())
                .collect();
            let _ = write!(
                out,
                r#"{{"op":{},"seq":{},"state":"{}","numel":{},"dtype":{},"reduce_op":{},"root":{},"peers":[{}],"queued_unix_us":{},"queued_to_started_us":{},"started_to_finished_us":{},"error":{}}}"#,
                json_string(e.fp.kind.name()),
                e.fp.seq,
                e.state.name(),
                e.fp.numel,
                e.fp.dtype
                    .map_or("null".into(), |d| json_string(&d.to_string())),
                reduce_name(e.fp.reduce_op).map_or("null".into(), json_string),
                e.fp.root,
                peers.join(","),
                e.queued_unix_us,
                us(e.queued, e.started),
                e.started.map_or("null".into(), |s| us(s, e.finished)),
                e.error.as_deref().map_or("null".into(), json_string),
            );
        }
        out.push_str("]}");
        out
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::fingerprint::CollectiveKind;
    use crate::tensor::DType;

    fn fp(seq: u64) -> Fingerprint {
        Fingerprint {
            kind: CollectiveKind::Broadcast,
            reduce_op: 0,
            dtype: Some(DType::I64),
            root: 1,
            seq,
            numel: 6,
            shape_hash: 0,
        }
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\nd\u{1}é"), r#""a\"b\\c\nd\u0001é""#);
    }

    #[test]
    fn keeps_the_last_entries_with_their_states_and_dumps_to_a_file() {
        let rec = FlightRecorder::new(2, 0, 3, "my/group");
        for seq in 0..3 {
            rec.queued(&fp(seq));
        }
        rec.started(1);
        rec.finished(1, &Err(Error::InvalidArgument("bad \"thing\"".into())));
        let json = rec.to_json();
        assert!(!json.contains(r#""seq":0"#), "{json}");
        assert!(
            json.contains(r#""op":"broadcast","seq":1,"state":"failed","numel":6,"dtype":"i64","reduce_op":null,"root":1,"peers":[1,2]"#),
            "{json}"
        );
        assert!(json.contains(r#"bad \"thing\""#), "{json}");
        assert!(json.contains(r#""seq":2,"state":"queued""#), "{json}");
        assert!(json.contains(r#""queued_to_started_us":null"#), "{json}");
        let dir = tempfile::tempdir().unwrap();
        let path = rec.dump(Some(dir.path())).unwrap().unwrap();
        assert!(path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .contains("my_group_rank0"));
        assert_eq!(std::fs::read_to_string(path).unwrap(), json);
        let off = FlightRecorder::new(0, 0, 1, "g");
        off.queued(&fp(0));
        assert!(off.to_json().ends_with(r#""entries":[]}"#));
    }
}
