//! The CPU transport's framing of untrusted peer bytes: the hello that
//! opens every TCP connection of the mesh, and the point-to-point message
//! stream (a header, then the payload it announces) read into a mailbox.
//! Checked: no panic, no allocation beyond what the peer actually sent
//! (the smoke test and libFuzzer's malloc limit watch that), and a hello
//! that is accepted is exactly the encoding of what it names.

use super::input::Input;
use super::mock_transport::StreamTransport;
use crate::cpu::p2p::{read_messages, Mailbox};
use crate::cpu::transport::tcp::setup::{accepted_hello, connecting_hello, HELLO_LEN};
use crate::job_token::JobToken;

pub fn transport_frames(data: &[u8]) {
    let mut input = Input(data);
    match input.u8() % 2 {
        0 => hello(input.rest()),
        _ => p2p_stream(input.rest()),
    }
}

/// A hello is accepted only with the mesh's tag: with or without a token,
/// an accepted hello is the one a rank of this mesh would send (a tag
/// cannot be guessed, so the fuzzer mostly explores refusals).
fn hello(bytes: &[u8]) {
    const MESH: u64 = 0x1234_5678_9abc_def0;
    let mut raw = [0u8; HELLO_LEN];
    let n = bytes.len().min(HELLO_LEN);
    raw[..n].copy_from_slice(&bytes[..n]);
    let token = JobToken::new("fuzz");
    for token in [None, Some(&token)] {
        if let Some(rank) = accepted_hello(&raw, MESH, token) {
            let world = u32::from_le_bytes([raw[16], raw[17], raw[18], raw[19]]);
            let again = connecting_hello(MESH, world, rank, token);
            // The verdict and token-flag words are not authenticated (a
            // refusal's reasons); everything else is.
            assert_eq!(
                again[..24],
                raw[..24],
                "an accepted hello names another mesh"
            );
            assert_eq!(again[32..], raw[32..], "an accepted hello has another tag");
        }
    }
}

fn p2p_stream(stream: &[u8]) {
    let transport = StreamTransport::new(0, 2, stream);
    let mailbox = Mailbox::new(0, 2);
    let why = read_messages(&transport, 1, &mailbox);
    assert!(!why.is_empty(), "a closed stream gives a reason");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corpus_hellos_are_accepted_and_a_changed_one_is_not() {
        const MESH: u64 = 0x1234_5678_9abc_def0;
        let token = JobToken::new("fuzz");
        let seeds = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/corpus/transport_frames/"
        );
        for (name, token) in [("seed-hello", None), ("seed-hello_token", Some(&token))] {
            let bytes = std::fs::read(format!("{seeds}{name}")).unwrap();
            let raw: [u8; HELLO_LEN] = bytes[1..].try_into().unwrap();
            assert_eq!(accepted_hello(&raw, MESH, token), Some(2), "{name}");
            let other = JobToken::new("other");
            assert_eq!(accepted_hello(&raw, MESH, Some(&other)), None, "{name}");
            let mut changed = raw;
            changed[20] ^= 1; // the rank
            assert_eq!(accepted_hello(&changed, MESH, token), None, "{name}");
        }
    }

    #[test]
    fn a_message_announced_huge_and_cut_short_is_a_closed_peer() {
        // Found by fuzzing: the reader reserved (and zeroed) what the
        // header announced before any payload arrived.
        let mut stream = b"TCP2\0\0\0\0".to_vec();
        stream.extend_from_slice(&7u64.to_le_bytes());
        stream.extend_from_slice(&(1u64 << 40).to_le_bytes());
        stream.extend_from_slice(b"only this");
        let transport = StreamTransport::new(0, 2, &stream);
        let why = read_messages(&transport, 1, &Mailbox::new(0, 2));
        assert!(why.contains("the input ran out"), "{why}");
    }
}
