//! Sub-groups (`new_group`) of the CPU process group: their own ranks,
//! sequence numbers and connections, running beside the parent; and the
//! checks on the ranks given. Every test runs once per transport (modules
//! `tcp` and `shm`): the parent's routes and every sub-group's are checked,
//! as a sub-group takes its parent's transport.

mod common;

use std::sync::Arc;

use common::{assert_routes, groups_over, on_every_rank};
use tensorcomm::cpu::backend::ProcessGroupCpu;
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::{DType, Tensor};
use tensorcomm::Error;

over_transports!(
    overlapping_subgroups_number_their_ranks_and_sequences_on_their_own,
    subgroups_of_subgroups_work,
    bad_rank_lists_are_refused_and_the_group_stays_usable,
);

/// One group per rank over `choice`, routes checked.
fn groups(world: usize, choice: TransportChoice) -> Vec<ProcessGroupCpu> {
    groups_over(world, &Arc::new(HashStore::new()), "pg", choice)
}

fn overlapping_subgroups_number_their_ranks_and_sequences_on_their_own(choice: TransportChoice) {
    let pgs = groups(4, choice);
    on_every_rank(&pgs, |pg| {
        let rank = pg.rank();
        // The parent runs a collective first: sub-groups still start at 0.
        let t = Tensor::from_vec(vec![rank as i32], &[1]).unwrap();
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(t.to_vec::<i32>().unwrap(), [6]);

        let odd = pg.new_subgroup(&[3, 1]).unwrap();
        let low = ProcessGroup::new_group(pg, &[0, 1, 2]).unwrap();
        assert_eq!(odd.is_some(), rank % 2 == 1);
        assert_eq!(low.is_some(), rank < 3);

        if let Some(odd) = &odd {
            assert_eq!((odd.rank(), odd.size()), (rank / 2, 2));
            assert_routes(odd, choice);
            let t = Tensor::from_vec(vec![rank as i64; 3], &[3]).unwrap();
            odd.all_reduce(&t, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(t.to_vec::<i64>().unwrap(), [4; 3]);
            // Point-to-point uses sub-group ranks.
            let m = Tensor::from_vec(vec![rank as u8], &[1]).unwrap();
            if odd.rank() == 0 {
                odd.send(&m, 1, 0, None).unwrap().wait().unwrap();
            } else {
                let w = odd.recv_any_source(&m, 0, None).unwrap();
                assert!(w.wait_timeout(std::time::Duration::from_secs(30)));
                assert_eq!(w.source_rank(), Some(0));
                w.wait().unwrap();
                assert_eq!(m.to_vec::<u8>().unwrap(), [1]);
            }
            let json = odd.flight_recorder_json();
            assert!(
                json.contains(r#""op":"all_reduce","seq":0,"state":"completed""#),
                "{json}"
            );
        }
        if let Some(low) = &low {
            assert_eq!((low.rank(), low.size()), (rank, 3));
            let t = Tensor::from_vec(vec![rank as f32 + 1.0; 2], &[2]).unwrap();
            low.broadcast(&t, 2, None).unwrap().wait().unwrap();
            low.all_reduce(&t, ReduceOp::Max, None)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(t.to_vec::<f32>().unwrap(), [3.0; 2]);
            low.barrier(None).unwrap().wait().unwrap();
        }
        // The parent is still in step after all that.
        let t = Tensor::from_vec(vec![1u8; 2], &[2]).unwrap();
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(t.to_vec::<u8>().unwrap(), [4, 4]);
        let json = pg.flight_recorder_json();
        assert!(json.contains(r#""seq":1,"state":"completed""#), "{json}");
        assert!(!json.contains(r#""seq":2"#), "{json}");
    });
}

fn subgroups_of_subgroups_work(choice: TransportChoice) {
    let pgs = groups(3, choice);
    on_every_rank(&pgs, |pg| {
        let Some(pair) = pg.new_subgroup(&[1, 2]).unwrap() else {
            return;
        };
        assert_routes(&pair, choice);
        let solo = pair.new_subgroup(&[1]).unwrap();
        assert_eq!(solo.is_some(), pg.rank() == 2);
        if let Some(solo) = solo {
            assert_eq!((solo.rank(), solo.size()), (0, 1));
            let t = Tensor::from_vec(vec![5i32], &[1]).unwrap();
            solo.all_reduce(&t, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(t.to_vec::<i32>().unwrap(), [5]);
        }
        let t = Tensor::from_vec(vec![pg.rank() as i32], &[1]).unwrap();
        pair.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(t.to_vec::<i32>().unwrap(), [3]);
    });
}

fn bad_rank_lists_are_refused_and_the_group_stays_usable(choice: TransportChoice) {
    let pgs = groups(2, choice);
    for (ranks, needle) in [
        (&[0, 1, 1][..], "found 1 more than once"),
        (&[0, 2][..], "0..2, found 2"),
        (&[][..], "found none"),
    ] {
        match pgs[0].new_subgroup(ranks) {
            Err(Error::InvalidCollective { op, reason }) => {
                assert_eq!(op, "new_group");
                assert!(reason.contains(needle), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
    // No namespace was used up by the refusals: both ranks agree on the next.
    on_every_rank(&pgs, |pg| {
        let both = pg.new_subgroup(&[0, 1]).unwrap().unwrap();
        assert_routes(&both, choice);
        let t = Tensor::zeros(&[2], DType::F64).unwrap();
        t.fill(pg.rank() as f64 + 0.5).unwrap();
        both.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(t.to_vec::<f64>().unwrap(), [2.0, 2.0]);
    });
}
