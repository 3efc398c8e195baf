//! Rust types that can be a tensor's elements.

use half::{bf16, f16};

use super::DType;

mod sealed {
    pub trait Sealed {}
}

/// A plain-old-data Rust type with a [`DType`]: `f32`, `f64`, `f16`, `bf16`,
/// `i8`, `u8`, `i32`, `i64`.
///
/// The trait is sealed: the set of dtypes is closed. `bool` has a dtype
/// ([`DType::Bool`]) but is not plain old data (only 0 and 1 are valid
/// bytes), so bool tensors are stored as `u8` bytes holding 0 or 1 and have
/// their own constructors ([`Tensor::from_bools`](super::Tensor::from_bools),
/// [`Tensor::from_bool_bytes`](super::Tensor::from_bool_bytes)).
///
/// ```
/// use tensorcomm::tensor::{DType, Element};
///
/// assert_eq!(<half::bf16 as Element>::DTYPE, DType::BF16);
/// assert_eq!(i64::DTYPE, DType::I64);
/// ```
pub trait Element: bytemuck::Pod + Send + Sync + sealed::Sealed {
    /// The dtype of tensors holding this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $dtype:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
        }
    )*};
}

element! {
    f32 => F32,
    f64 => F64,
    f16 => F16,
    bf16 => BF16,
    i8 => I8,
    u8 => U8,
    i32 => I32,
    i64 => I64,
}

/// Runs `$body` with `$T` bound to the Rust type that stores `$dtype`
/// (`u8` for [`DType::Bool`]).
macro_rules! dispatch_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::tensor::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::tensor::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::tensor::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::tensor::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::tensor::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::tensor::DType::U8 | $crate::tensor::DType::Bool => {
                type $T = u8;
                $body
            }
            $crate::tensor::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::tensor::DType::I64 => {
                type $T = i64;
                $body
            }
        }
    };
}
pub(crate) use dispatch_dtype;

#[cfg(test)]
mod tests {
    use super::*;

    fn storage_size(dtype: DType) -> usize {
        dispatch_dtype!(dtype, T => std::mem::size_of::<T>())
    }

    #[test]
    fn every_dtype_is_stored_in_a_type_of_its_size() {
        for dtype in DType::ALL {
            assert_eq!(storage_size(dtype), dtype.size(), "{dtype}");
        }
    }

    #[test]
    fn element_dtypes_match_their_sizes() {
        fn check<T: Element>() {
            assert_eq!(std::mem::size_of::<T>(), T::DTYPE.size(), "{}", T::DTYPE);
        }
        check::<f32>();
        check::<f64>();
        check::<f16>();
        check::<bf16>();
        check::<i8>();
        check::<u8>();
        check::<i32>();
        check::<i64>();
    }
}
