//! [`Report`]: an [`Error`] as a program's `main` should print it.

use std::fmt;

use super::Error;

/// An [`Error`] as `main` prints it: its message, then each cause on a
/// line of its own, instead of the `Debug` structure that a `main`
/// returning `Result<(), Error>` prints (`Error: MissingEnv { .. }`).
/// `?` turns any tensorcomm error into one.
///
/// ```
/// fn main() -> Result<(), tensorcomm::Report> {
///     let t = tensorcomm::tensor::Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
///     assert_eq!(t.numel(), 2);
///     Ok(())
/// }
/// ```
///
/// ```
/// let report = tensorcomm::Report::from(tensorcomm::Error::MissingEnv {
///     name: "RANK".into(),
///     context: "env://".into(),
/// });
/// assert_eq!(format!("{report:?}"), "environment variable RANK is not set (needed by env://)");
/// ```
pub struct Report(Error);

impl Report {
    /// The error reported.
    pub fn error(&self) -> &Error {
        &self.0
    }

    /// The error, taken back.
    pub fn into_error(self) -> Error {
        self.0
    }
}

impl From<Error> for Report {
    fn from(error: Error) -> Self {
        Report(error)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = std::error::Error::source(&self.0);
        while let Some(c) = cause {
            write!(f, "\n  caused by: {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

/// The same text as [`Display`](fmt::Display): `main` prints a returned
/// error with `Debug`.
impl fmt::Debug for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_follow_the_message_a_line_each() {
        let inner = Error::PeerClosed {
            peer: 2,
            during: "all_reduce".into(),
            reason: "connection reset".into(),
        };
        let outer = Error::CollectiveFailed {
            op: "all_reduce".into(),
            seq: 7,
            rank: 0,
            ranks: vec![2],
            source: Box::new(inner),
        };
        let text = format!("{:?}", Report::from(outer));
        assert!(
            text.starts_with("all_reduce (sequence number 7) failed on rank 0"),
            "{text}"
        );
        assert!(
            text.contains("\n  caused by: peer rank 2 is gone while all_reduce"),
            "{text}"
        );
        assert!(!text.contains("CollectiveFailed {"), "{text}");
    }
}
