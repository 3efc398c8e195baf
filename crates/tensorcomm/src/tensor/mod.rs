//! The tensor model: dtypes, devices, dense and sparse tensor handles.

mod dtype;

pub use dtype::DType;
