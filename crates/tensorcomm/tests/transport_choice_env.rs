//! TENSORCOMM_TRANSPORT decides the CPU group's transport when the options
//! leave it to the environment. Its own test binary: it sets the variable.

use std::sync::Arc;

use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
use tensorcomm::cpu::transport::{Route, TransportChoice};
use tensorcomm::group::ProcessGroup;
use tensorcomm::store::HashStore;
use tensorcomm::Error;

fn pair(prefix: &str) -> tensorcomm::Result<Vec<ProcessGroupCpu>> {
    let store = Arc::new(HashStore::new());
    let hs: Vec<_> = (0..2)
        .map(|rank| {
            let (store, prefix) = (store.clone(), prefix.to_string());
            std::thread::spawn(move || {
                ProcessGroupCpu::new(store, &prefix, rank, 2, &CpuOptions::default())
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn the_environment_variable_picks_the_transport_and_bad_values_are_named() {
    assert_eq!(CpuOptions::default().transport, TransportChoice::Env);
    std::env::set_var("TENSORCOMM_TRANSPORT", "tcp");
    assert_eq!(pair("tcp").unwrap()[0].route(1), Route::Tcp);
    std::env::set_var("TENSORCOMM_TRANSPORT", "SHM");
    assert_eq!(pair("shm").unwrap()[1].route(0), Route::Shm);
    std::env::remove_var("TENSORCOMM_TRANSPORT");
    assert_eq!(pair("auto").unwrap()[0].route(1), Route::Shm);
    std::env::set_var("TENSORCOMM_TRANSPORT", "udp");
    match ProcessGroupCpu::new(
        Arc::new(HashStore::new()),
        "bad",
        0,
        1,
        &CpuOptions::default(),
    ) {
        Err(Error::BadValue {
            name,
            expected,
            found,
        }) => {
            assert_eq!(name, "TENSORCOMM_TRANSPORT");
            assert_eq!(expected, "auto, tcp or shm");
            assert_eq!(found, "udp");
        }
        other => panic!("expected BadValue, found {other:?}"),
    }
    std::env::remove_var("TENSORCOMM_TRANSPORT");
}

/// Ranks that resolve different transports (here forced by their options;
/// the same holds for TENSORCOMM_TRANSPORT set on one rank only) fail group
/// creation promptly, each naming the variable and both values, instead of
/// waiting for connections that never come.
#[test]
fn ranks_choosing_different_transports_fail_creation_naming_both() {
    let store = Arc::new(HashStore::new());
    let started = std::time::Instant::now();
    let hs: Vec<_> = [TransportChoice::Tcp, TransportChoice::Shm]
        .into_iter()
        .enumerate()
        .map(|(rank, transport)| {
            let store = store.clone();
            std::thread::spawn(move || {
                let options = CpuOptions {
                    transport,
                    timeout: std::time::Duration::from_secs(10),
                    ..CpuOptions::default()
                };
                ProcessGroupCpu::new(store, "mixed", rank, 2, &options)
            })
        })
        .collect();
    let results: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let took = started.elapsed();
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Err(Error::TuningMismatch {
                variable,
                rank: r,
                mine,
                peer,
                theirs,
            }) => {
                assert_eq!(variable, "TENSORCOMM_TRANSPORT");
                assert_eq!((r, peer), (rank, 1 - rank));
                let expected = [("tcp", "auto or shm"), ("auto or shm", "tcp")][rank];
                assert_eq!((mine.as_str(), theirs.as_str()), expected);
            }
            other => panic!("rank {rank}: expected TuningMismatch, found {other:?}"),
        }
    }
    assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
}

/// `auto` and `shm` connect ranks of one host the same way: a group whose
/// ranks chose one each is created and works.
#[test]
fn auto_and_shm_agree() {
    let store = Arc::new(HashStore::new());
    let hs: Vec<_> = [TransportChoice::Auto, TransportChoice::Shm]
        .into_iter()
        .enumerate()
        .map(|(rank, transport)| {
            let store = store.clone();
            std::thread::spawn(move || -> tensorcomm::Result<Vec<f32>> {
                let options = CpuOptions {
                    transport,
                    timeout: std::time::Duration::from_secs(10),
                    ..CpuOptions::default()
                };
                let pg = ProcessGroupCpu::new(store, "auto-shm", rank, 2, &options)?;
                let t = tensorcomm::tensor::Tensor::from_vec(vec![rank as f32 + 1.0; 4], &[4])?;
                pg.all_reduce(&t, tensorcomm::ReduceOp::Sum, None)?.wait()?;
                t.to_vec::<f32>()
            })
        })
        .collect();
    for h in hs {
        assert_eq!(h.join().unwrap().unwrap(), [3.0; 4]);
    }
}
