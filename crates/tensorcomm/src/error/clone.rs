//! `Clone` for [`Error`]: a `Work`'s outcome is stored once and handed to
//! every taker (`Work::wait`, each of its futures), each getting its own
//! copy of the same typed error.

use super::Error;

/// A copy of the same variant with the same fields, so a copy prints and
/// matches like the original. The exception is an `std::io::Error` inside
/// (`Io`, `PeerIo`), which is not `Clone`: it is rebuilt from its OS error
/// code, or else from its kind and message, so the copy keeps its kind and
/// message but not the error it wrapped.
///
/// ```
/// use tensorcomm::Error;
/// let e = Error::PeerClosed { peer: 3, during: "all_reduce".into(), reason: "EOF".into() };
/// assert_eq!(e.clone().to_string(), e.to_string());
/// let io = Error::io("reading x", std::io::Error::from_raw_os_error(2));
/// assert_eq!(io.clone().to_string(), io.to_string());
/// ```
impl Clone for Error {
    fn clone(&self) -> Self {
        match self {
            Error::ShapeMismatch {
                context,
                expected,
                found,
            } => Error::ShapeMismatch {
                context: context.clone(),
                expected: expected.clone(),
                found: found.clone(),
            },
            Error::DTypeMismatch {
                context,
                expected,
                found,
            } => Error::DTypeMismatch {
                context: context.clone(),
                expected: *expected,
                found: *found,
            },
            Error::DimOutOfRange { dim, ndim } => Error::DimOutOfRange {
                dim: *dim,
                ndim: *ndim,
            },
            Error::InvalidLayout(a) => Error::InvalidLayout(a.clone()),
            Error::InvalidArgument(a) => Error::InvalidArgument(a.clone()),
            Error::InvalidSparse(a) => Error::InvalidSparse(a.clone()),
            Error::StoreFileNotRegular { path, found } => Error::StoreFileNotRegular {
                path: path.clone(),
                found: found.clone(),
            },
            Error::StoreTimeout { keys, timeout } => Error::StoreTimeout {
                keys: keys.clone(),
                timeout: *timeout,
            },
            Error::KeyNotFound { key } => Error::KeyNotFound { key: key.clone() },
            Error::NotACounter { key, found } => Error::NotACounter {
                key: key.clone(),
                found: found.clone(),
            },
            Error::CounterOverflow {
                key,
                current,
                delta,
            } => Error::CounterOverflow {
                key: key.clone(),
                current: *current,
                delta: *delta,
            },
            Error::AddressInUse { addr } => Error::AddressInUse { addr: addr.clone() },
            Error::ListenAddress { what, addr, reason } => Error::ListenAddress {
                what: what.clone(),
                addr: addr.clone(),
                reason: reason.clone(),
            },
            Error::ClientsTimeout {
                joined,
                expected,
                timeout,
            } => Error::ClientsTimeout {
                joined: *joined,
                expected: *expected,
                timeout: *timeout,
            },
            Error::StoreConnect {
                addr,
                timeout,
                reason,
            } => Error::StoreConnect {
                addr: addr.clone(),
                timeout: *timeout,
                reason: reason.clone(),
            },
            Error::StoreConnectionLost { addr, reason } => Error::StoreConnectionLost {
                addr: addr.clone(),
                reason: reason.clone(),
            },
            Error::StoreRefused { addr, reason } => Error::StoreRefused {
                addr: addr.clone(),
                reason: reason.clone(),
            },
            Error::Protocol { expected, found } => Error::Protocol {
                expected: expected.clone(),
                found: found.clone(),
            },
            Error::MessageTooLarge { size, max } => Error::MessageTooLarge {
                size: *size,
                max: *max,
            },
            Error::StoreServer { addr, reason } => Error::StoreServer {
                addr: addr.clone(),
                reason: reason.clone(),
            },
            Error::BarrierOverflow {
                key,
                expected,
                found,
            } => Error::BarrierOverflow {
                key: key.clone(),
                expected: *expected,
                found: *found,
            },
            Error::BarrierTimeout {
                key,
                arrived,
                expected,
                timeout,
            } => Error::BarrierTimeout {
                key: key.clone(),
                arrived: *arrived,
                expected: *expected,
                timeout: *timeout,
            },
            Error::MissingEnv { name, context } => Error::MissingEnv {
                name: name.clone(),
                context: context.clone(),
            },
            Error::BadValue {
                name,
                expected,
                found,
            } => Error::BadValue {
                name: name.clone(),
                expected: expected.clone(),
                found: found.clone(),
            },
            Error::MissingParam { url, name } => Error::MissingParam {
                url: url.clone(),
                name: name.clone(),
            },
            Error::UnsupportedInitMethod { found } => Error::UnsupportedInitMethod {
                found: found.clone(),
            },
            Error::ShmBadHeader {
                segment,
                field,
                expected,
                found,
            } => Error::ShmBadHeader {
                segment: segment.clone(),
                field: field.clone(),
                expected: expected.clone(),
                found: found.clone(),
            },
            Error::ShmPeerNotLocal {
                peer,
                expected,
                found,
            } => Error::ShmPeerNotLocal {
                peer: *peer,
                expected: expected.clone(),
                found: found.clone(),
            },
            Error::PeerClosed {
                peer,
                during,
                reason,
            } => Error::PeerClosed {
                peer: *peer,
                during: during.clone(),
                reason: reason.clone(),
            },
            Error::LinkShutDownHere { peer, during } => Error::LinkShutDownHere {
                peer: *peer,
                during: during.clone(),
            },
            Error::PeerTimeout {
                peer,
                during,
                timeout,
            } => Error::PeerTimeout {
                peer: *peer,
                during: during.clone(),
                timeout: *timeout,
            },
            Error::PeerIo {
                peer,
                during,
                source,
            } => Error::PeerIo {
                peer: *peer,
                during: during.clone(),
                source: clone_io(source),
            },
            Error::PeerRefused { peer, addr, reason } => Error::PeerRefused {
                peer: *peer,
                addr: addr.clone(),
                reason: reason.clone(),
            },
            Error::PeerProtocol {
                peer,
                expected,
                found,
            } => Error::PeerProtocol {
                peer: *peer,
                expected: expected.clone(),
                found: found.clone(),
            },
            Error::InvalidCollective { op, reason } => Error::InvalidCollective {
                op: op.clone(),
                reason: reason.clone(),
            },
            Error::UnsupportedReduceOp {
                op,
                reduce_op,
                what,
            } => Error::UnsupportedReduceOp {
                op: op.clone(),
                reduce_op: reduce_op.clone(),
                what: what.clone(),
            },
            Error::CollectiveMismatch {
                rank,
                peer,
                mine,
                theirs,
            } => Error::CollectiveMismatch {
                rank: *rank,
                peer: *peer,
                mine: mine.clone(),
                theirs: theirs.clone(),
            },
            Error::TuningMismatch {
                variable,
                rank,
                mine,
                peer,
                theirs,
            } => Error::TuningMismatch {
                variable: variable.clone(),
                rank: *rank,
                mine: mine.clone(),
                peer: *peer,
                theirs: theirs.clone(),
            },
            Error::CollectiveFailed {
                op,
                seq,
                rank,
                ranks,
                source,
            } => Error::CollectiveFailed {
                op: op.clone(),
                seq: *seq,
                rank: *rank,
                ranks: ranks.clone(),
                source: source.clone(),
            },
            Error::GroupSetupFailed {
                what,
                rank,
                failed,
                reason,
            } => Error::GroupSetupFailed {
                what: what.clone(),
                rank: *rank,
                failed: *failed,
                reason: reason.clone(),
            },
            Error::GroupBroken { op, seq } => Error::GroupBroken {
                op: op.clone(),
                seq: *seq,
            },
            Error::MessageSizeMismatch {
                rank,
                peer,
                tag,
                expected,
                found,
            } => Error::MessageSizeMismatch {
                rank: *rank,
                peer: *peer,
                tag: *tag,
                expected: *expected,
                found: *found,
            },
            Error::NoMessage { rank, tag, reason } => Error::NoMessage {
                rank: *rank,
                tag: *tag,
                reason: reason.clone(),
            },
            Error::FutureFailed { reason } => Error::FutureFailed {
                reason: reason.clone(),
            },
            Error::RanksMissing { missing, timeout } => Error::RanksMissing {
                missing: missing.clone(),
                timeout: *timeout,
            },
            Error::CollectiveTimeout {
                what,
                timeout,
                progress,
                lagging,
            } => Error::CollectiveTimeout {
                what: what.clone(),
                timeout: *timeout,
                progress: progress.clone(),
                lagging: lagging.clone(),
            },
            Error::NoCuda { reason } => Error::NoCuda {
                reason: reason.clone(),
            },
            Error::Cuda {
                call,
                code,
                message,
            } => Error::Cuda {
                call: call.clone(),
                code: code.clone(),
                message: message.clone(),
            },
            Error::NcclUnavailable { library, reason } => Error::NcclUnavailable {
                library: library.clone(),
                reason: reason.clone(),
            },
            Error::Nccl {
                call,
                code,
                message,
            } => Error::Nccl {
                call: call.clone(),
                code: code.clone(),
                message: message.clone(),
            },
            Error::NcclInitTimeout {
                rank,
                size,
                device,
                timeout,
                joined,
            } => Error::NcclInitTimeout {
                rank: *rank,
                size: *size,
                device: *device,
                timeout: *timeout,
                joined: *joined,
            },
            Error::IntraNodeUnavailable { reason } => Error::IntraNodeUnavailable {
                reason: reason.clone(),
            },
            Error::IntraNodeFailed { rank, reason } => Error::IntraNodeFailed {
                rank: *rank,
                reason: reason.clone(),
            },
            Error::GraphRegistration { rank, reason } => Error::GraphRegistration {
                rank: *rank,
                reason: reason.clone(),
            },
            Error::Nvrtc { kernel, arch, log } => Error::Nvrtc {
                kernel: kernel.clone(),
                arch: arch.clone(),
                log: log.clone(),
            },
            Error::CommArgument {
                op,
                what,
                index,
                expected,
                found,
            } => Error::CommArgument {
                op,
                what: what.clone(),
                index: *index,
                expected: expected.clone(),
                found: found.clone(),
            },
            Error::ParamsMismatch {
                rank,
                peer,
                mine,
                theirs,
            } => Error::ParamsMismatch {
                rank: *rank,
                peer: *peer,
                mine: mine.clone(),
                theirs: theirs.clone(),
            },
            Error::ReducerMisuse {
                iteration,
                expected,
                found,
            } => Error::ReducerMisuse {
                iteration: *iteration,
                expected: expected.clone(),
                found: found.clone(),
            },
            Error::Io { context, source } => Error::Io {
                context: context.clone(),
                source: clone_io(source),
            },
        }
    }
}

fn clone_io(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(e.kind(), e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_keep_the_variant_fields_and_message() {
        let inner = Error::PeerIo {
            peer: 2,
            during: "sending".into(),
            source: std::io::Error::new(std::io::ErrorKind::BrokenPipe, "pipe closed"),
        };
        let e = Error::CollectiveFailed {
            op: "all_reduce".into(),
            seq: 7,
            rank: 1,
            ranks: vec![2],
            source: Box::new(inner),
        };
        let copy = e.clone();
        assert_eq!(copy.to_string(), e.to_string());
        match copy {
            Error::CollectiveFailed {
                seq: 7,
                ranks,
                source,
                ..
            } => {
                assert_eq!(ranks, [2]);
                match *source {
                    Error::PeerIo {
                        peer: 2, source, ..
                    } => {
                        assert_eq!(source.kind(), std::io::ErrorKind::BrokenPipe);
                        assert_eq!(source.to_string(), "pipe closed");
                    }
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("{other:?}"),
        }
        let os = std::io::Error::from_raw_os_error(libc::ECONNRESET);
        match Error::io("reading", os).clone() {
            Error::Io { source, .. } => assert_eq!(source.raw_os_error(), Some(libc::ECONNRESET)),
            other => panic!("{other:?}"),
        }
    }
}
