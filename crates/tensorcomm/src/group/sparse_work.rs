//! `SparseWork`: the handle a sparse all-reduce returns, which gives the
//! reduced tensor (its number of entries is only known at the end).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::{Work, WorkFuture};
use crate::tensor::SparseTensor;
use crate::{Error, Result};

/// Where the collective leaves its result.
pub(crate) type SparseSlot = Arc<Mutex<Option<SparseTensor>>>;

/// A sparse all-reduce in flight (or finished).
///
/// ```
/// use tensorcomm::{init_process_group, Backend, ReduceOp};
/// use tensorcomm::tensor::{SparseTensor, Tensor};
///
/// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// let s = SparseTensor::new(vec![2, 0, 2], Tensor::from_vec(vec![1i32, 2, 3], &[3])?, &[4])?;
/// let sum = pg.all_reduce_sparse(&s, ReduceOp::Sum, None)?.wait()?;
/// assert_eq!((sum.indices(), sum.values().to_vec::<i32>()?), (&[0, 2][..], vec![2, 4]));
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[must_use = "a collective's errors are only seen through its Work"]
#[derive(Debug)]
pub struct SparseWork {
    work: Work,
    slot: SparseSlot,
}

impl SparseWork {
    pub(crate) fn new(work: Work, slot: SparseSlot) -> Self {
        SparseWork { work, slot }
    }

    /// True once the collective has finished, successfully or not.
    pub fn is_completed(&self) -> bool {
        self.work.is_completed()
    }

    /// Waits at most `timeout` for the collective to finish; true if it has.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        self.work.wait_timeout(timeout)
    }

    /// A future of the collective's outcome (not of its result, which
    /// [`wait`](SparseWork::wait) gives), for callbacks that run once it
    /// has finished, as [`Work::get_future`].
    ///
    /// ```
    /// use tensorcomm::{init_process_group, Backend, ReduceOp};
    /// use tensorcomm::tensor::{SparseTensor, Tensor};
    ///
    /// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// let s = SparseTensor::new(vec![1], Tensor::from_vec(vec![5i64], &[1])?, &[2])?;
    /// let work = pg.all_reduce_sparse(&s, ReduceOp::Sum, None)?;
    /// work.get_future().then(|outcome| outcome).wait()?;
    /// assert!(work.is_completed());
    /// assert_eq!(work.wait()?.values().to_vec::<i64>()?, [5]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn get_future(&self) -> WorkFuture<()> {
        self.work.get_future()
    }

    /// Waits for the collective and returns the coalesced sum.
    pub fn wait(self) -> Result<SparseTensor> {
        self.work.wait()?;
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| {
                Error::InvalidArgument("all_reduce_sparse finished without a result".into())
            })
    }
}
