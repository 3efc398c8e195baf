//! Runs every fuzz target body (`tensorcomm::fuzz_targets`) on its
//! checked-in seed corpus (`fuzz/corpus/<target>/`) and on mutations of
//! it drawn from a fixed-seed generator: a few thousand inputs per
//! target, a few seconds in all, on the stable toolchain. The long runs
//! use `cargo fuzz` (see the README's Fuzzing section).
//!
//! An input fails the test when the body panics, or when it made a single
//! allocation larger than [`MAX_ALLOCATION`] (memory must follow the bytes
//! a peer sent, never a length it announced). The failing input is
//! printed in hex, to be added to the corpus as a regression case.
//! `TENSORCOMM_FUZZ_SMOKE_INPUTS=N` sets the mutations per target.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Instant;

use tensorcomm::fuzz_targets::TARGETS;

mod rng;
use rng::Rng;

/// The largest single allocation one input may cause.
const MAX_ALLOCATION: usize = 64 << 20;

/// Mutated inputs per target by default.
const DEFAULT_INPUTS: usize = 3000;

/// Longest input the generator makes.
const MAX_LEN: usize = 4096;

struct Watching;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; it only
// records the largest size asked for on this thread.
unsafe impl GlobalAlloc for Watching {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is passed on as it is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

#[global_allocator]
static ALLOCATOR: Watching = Watching;

/// Values that find edge cases in length fields.
const INTERESTING: &[u64] = &[
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0xffff,
    1 << 31,
    u32::MAX as u64,
    u64::MAX,
];

/// One libFuzzer-like mutation (or a few stacked) of a corpus entry.
fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut v = if corpus.is_empty() || rng.below(16) == 0 {
        (0..rng.below(64)).map(|_| rng.next() as u8).collect()
    } else {
        corpus[rng.below(corpus.len())].clone()
    };
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.next() as u8);
            }
            3 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = 1 + rng.below((v.len() - i).min(16));
                v.drain(i..i + n);
            }
            4 if v.len() >= 8 => {
                let i = rng.below(v.len() - 7);
                let x = INTERESTING[rng.below(INTERESTING.len())];
                let bytes = if rng.below(2) == 0 {
                    x.to_le_bytes().to_vec()
                } else {
                    (x as u32).to_le_bytes().to_vec()
                };
                v[i..i + bytes.len()].copy_from_slice(&bytes);
            }
            5 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(v.len() + 1);
                let from = rng.below(other.len() + 1);
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            _ => v.truncate(rng.below(v.len() + 1)),
        }
    }
    v.truncate(MAX_LEN);
    v
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading the seed corpus {}: {e}", dir.display()))
        .map(|e| e.expect("a corpus entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| std::fs::read(f).expect("a corpus file"))
        .collect()
}

/// Runs `body` on `input`; `Err` says what went wrong.
fn run_one(body: fn(&[u8]), input: &[u8]) -> Result<(), String> {
    LARGEST.with(|l| l.set(0));
    let outcome = catch_unwind(AssertUnwindSafe(|| body(input)));
    let largest = LARGEST.with(Cell::get);
    match outcome {
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into())),
        Ok(()) if largest > MAX_ALLOCATION => Err(format!(
            "an allocation of {largest} bytes, more than {MAX_ALLOCATION}"
        )),
        Ok(()) => Ok(()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn smoke(target: &str) {
    let body = TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .unwrap_or_else(|| panic!("no fuzz target {target}"))
        .1;
    let seeds = corpus(target);
    assert!(!seeds.is_empty(), "{target} has no seed corpus");
    let inputs = std::env::var("TENSORCOMM_FUZZ_SMOKE_INPUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_INPUTS);
    let seed = target.bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut rng = Rng(seed | 1);
    let started = Instant::now();
    let mut failures = Vec::new();
    let mutated = (0..inputs).map(|_| mutate(&mut rng, &seeds));
    for input in seeds.iter().cloned().chain(mutated) {
        if let Err(why) = run_one(body, &input) {
            failures.push(format!("{why}\n  input: {}", hex(&input)));
            if failures.len() >= 5 {
                break;
            }
        }
    }
    eprintln!(
        "fuzz smoke {target}: {} seeds + {inputs} mutations in {:?}",
        seeds.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "fuzz target {target} failed on {} input(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_target_has_a_smoke_test() {
    let tested = [
        "store_server",
        "store_codec",
        "transport_frames",
        "fingerprint",
        "init_method",
        "size",
        "sparse",
        "sparse_all_reduce",
    ];
    let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, tested);
}

#[test]
fn store_server() {
    smoke("store_server");
}

#[test]
fn store_codec() {
    smoke("store_codec");
}

#[test]
fn transport_frames() {
    smoke("transport_frames");
}

#[test]
fn fingerprint() {
    smoke("fingerprint");
}

#[test]
fn init_method() {
    smoke("init_method");
}

#[test]
fn size() {
    smoke("size");
}

#[test]
fn sparse() {
    smoke("sparse");
}

#[test]
fn sparse_all_reduce() {
    smoke("sparse_all_reduce");
}
