//! Backend-agnostic process groups: the collectives' vocabulary.
//!
//! ```
//! use tensorcomm::group::ReduceOp;
//! assert_eq!(ReduceOp::Sum.name(), "SUM");
//! ```

mod reduce_op;

pub use reduce_op::ReduceOp;
