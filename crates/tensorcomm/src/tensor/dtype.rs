//! Element types a tensor can hold.

use std::fmt;

/// The element type of a tensor.
///
/// ```
/// use tensorcomm::tensor::DType;
/// assert_eq!(DType::BF16.size(), 2);
/// assert!(DType::F16.is_floating_point());
/// assert_eq!("i64".parse::<DType>().unwrap(), DType::I64);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I8,
    U8,
    I32,
    I64,
    Bool,
}

impl DType {
    /// Every dtype, in a fixed order (useful for tests and benchmarks).
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// True for f32, f64, f16 and bf16.
    pub const fn is_floating_point(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// The short lowercase name (`"f32"`, `"bf16"`, `"bool"`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Self> {
        let lower = s.to_ascii_lowercase();
        let found = match lower.as_str() {
            "f32" | "float32" | "float" => DType::F32,
            "f64" | "float64" | "double" => DType::F64,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "i8" | "int8" => DType::I8,
            "u8" | "uint8" => DType::U8,
            "i32" | "int32" | "int" => DType::I32,
            "i64" | "int64" | "long" => DType::I64,
            "bool" => DType::Bool,
            _ => {
                return Err(crate::Error::BadValue {
                    name: "dtype".into(),
                    expected: "one of f32, f64, f16, bf16, i8, u8, i32, i64, bool".into(),
                    found: s.into(),
                })
            }
        };
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_are_right() {
        let sizes = [4, 8, 2, 2, 1, 1, 4, 8, 1];
        for (dtype, size) in DType::ALL.into_iter().zip(sizes) {
            assert_eq!(dtype.name().parse::<DType>().unwrap(), dtype);
            assert_eq!(dtype.size(), size, "{dtype}");
        }
        assert!("f8".parse::<DType>().is_err());
    }
}
