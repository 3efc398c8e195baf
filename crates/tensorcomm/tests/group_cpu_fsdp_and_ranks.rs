//! The coalesced tensor forms FSDP uses (`all_gather_into_tensor_coalesced`,
//! `reduce_scatter_tensor_coalesced`) and c10d's rank translation of
//! sub-groups (`get_global_rank`, `get_group_rank`). Every test runs once
//! per transport (modules `tcp` and `shm`).

mod common;

use std::sync::Arc;

use common::{groups_over, on_every_rank};
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::{DType, Tensor};
use tensorcomm::Error;

over_transports!(
    coalesced_gathers_fill_every_output,
    coalesced_reduce_scatters_give_each_rank_its_block,
    coalesced_forms_refuse_unpaired_lists_and_stay_usable,
    subgroups_translate_ranks_both_ways,
);

fn coalesced_gathers_fill_every_output(choice: TransportChoice) {
    let pgs = groups_over(3, &Arc::new(HashStore::new()), "pg", choice);
    on_every_rank(&pgs, |pg| {
        let r = pg.rank() as i32;
        // Two pairs: a 2-element and a 2x2 input; outputs concatenated
        // (dim 0 times 3) and stacked ([3, 2, 2]).
        let inputs = vec![
            Tensor::from_vec(vec![r, r + 10], &[2]).unwrap(),
            Tensor::from_vec(vec![r * 100; 4], &[2, 2]).unwrap(),
        ];
        let outputs = vec![
            Tensor::zeros(&[6], DType::I32).unwrap(),
            Tensor::zeros(&[3, 2, 2], DType::I32).unwrap(),
        ];
        pg.all_gather_into_tensor_coalesced(&outputs, &inputs, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(outputs[0].to_vec::<i32>().unwrap(), [0, 10, 1, 11, 2, 12]);
        let mut want = vec![0; 4];
        want.extend([100; 4]);
        want.extend([200; 4]);
        assert_eq!(outputs[1].to_vec::<i32>().unwrap(), want);
    });
}

fn coalesced_reduce_scatters_give_each_rank_its_block(choice: TransportChoice) {
    let pgs = groups_over(2, &Arc::new(HashStore::new()), "pg", choice);
    on_every_rank(&pgs, |pg| {
        let r = pg.rank() as f32;
        let inputs = vec![
            Tensor::from_vec(vec![1.0f32 + r, 2.0, 3.0, 4.0 + r], &[4]).unwrap(),
            Tensor::from_vec(vec![r; 2], &[2, 1]).unwrap(),
        ];
        let outputs = vec![
            Tensor::zeros(&[2], DType::F32).unwrap(),
            Tensor::zeros(&[1, 1], DType::F32).unwrap(),
        ];
        pg.reduce_scatter_tensor_coalesced(&outputs, &inputs, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        // Sums: [3, 4, 6, 9] and [1, 1].
        let first = if pg.rank() == 0 {
            [3.0, 4.0]
        } else {
            [6.0, 9.0]
        };
        assert_eq!(outputs[0].to_vec::<f32>().unwrap(), first);
        assert_eq!(outputs[1].to_vec::<f32>().unwrap(), [1.0]);
    });
}

fn coalesced_forms_refuse_unpaired_lists_and_stay_usable(choice: TransportChoice) {
    let pgs = groups_over(2, &Arc::new(HashStore::new()), "pg", choice);
    on_every_rank(&pgs, |pg| {
        let inputs = vec![Tensor::zeros(&[2], DType::F32).unwrap()];
        let outputs = vec![
            Tensor::zeros(&[4], DType::F32).unwrap(),
            Tensor::zeros(&[4], DType::F32).unwrap(),
        ];
        let err = pg
            .all_gather_into_tensor_coalesced(&outputs, &inputs, None)
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidCollective { op, reason }
                if op == "all_gather_into_tensor_coalesced" && reason.contains("found 2 outputs")),
            "{err}"
        );
        // An output of the wrong size is named with both shapes.
        let wrong = vec![Tensor::zeros(&[3], DType::F32).unwrap()];
        let err = pg
            .reduce_scatter_tensor_coalesced(&inputs, &wrong, ReduceOp::Sum, None)
            .unwrap_err();
        assert!(
            matches!(&err, Error::ShapeMismatch { context, .. } if context.contains("inputs[0]")),
            "{err}"
        );
        // Nothing was sent: the group still runs collectives.
        let t = Tensor::from_vec(vec![1i64], &[1]).unwrap();
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(t.to_vec::<i64>().unwrap(), [2]);
    });
}

fn subgroups_translate_ranks_both_ways(choice: TransportChoice) {
    let pgs = groups_over(4, &Arc::new(HashStore::new()), "pg", choice);
    on_every_rank(&pgs, |pg| {
        assert_eq!(pg.global_ranks(), [0, 1, 2, 3]);
        let odd = pg.new_group(&[3, 1]).unwrap();
        let Some(odd) = odd else {
            assert!(pg.rank() % 2 == 0);
            return;
        };
        assert_eq!(odd.global_ranks(), [1, 3]);
        assert_eq!(odd.get_global_rank(1).unwrap(), 3);
        assert_eq!(odd.get_group_rank(1).unwrap(), 0);
        assert!(matches!(
            odd.get_group_rank(2),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            odd.get_global_rank(2),
            Err(Error::InvalidArgument(_))
        ));
        // A sub-group of the sub-group keeps translating to global ranks.
        let last = odd.new_group(&[1]).unwrap();
        if pg.rank() == 3 {
            let last = last.expect("global rank 3 is sub-group rank 1");
            assert_eq!(last.global_ranks(), [3]);
            assert_eq!(last.get_global_rank(0).unwrap(), 3);
        } else {
            assert!(last.is_none());
        }
    });
}
