//! The CPU transport's framing of untrusted peer bytes: the hello that
//! opens every TCP connection of the mesh, and the point-to-point message
//! stream (a header, then the payload it announces) read into a mailbox.
//! Checked: no panic, no allocation beyond what the peer actually sent
//! (the smoke test and libFuzzer's malloc limit watch that), and a hello
//! that is accepted is exactly the encoding of what it names.

use super::input::Input;
use super::mock_transport::StreamTransport;
use crate::cpu::p2p::{read_messages, Mailbox};
use crate::cpu::transport::tcp::setup::{Hello, HELLO_LEN};

pub fn transport_frames(data: &[u8]) {
    let mut input = Input(data);
    match input.u8() % 2 {
        0 => hello(input.rest()),
        _ => p2p_stream(input.rest()),
    }
}

fn hello(bytes: &[u8]) {
    let mut raw = [0u8; HELLO_LEN];
    let n = bytes.len().min(HELLO_LEN);
    raw[..n].copy_from_slice(&bytes[..n]);
    let expected = Hello {
        mesh: 0x1234_5678_9abc_def0,
        world_size: 4,
        rank: 0,
    };
    if let Ok(rank) = Hello::decode(&raw, &expected, 1) {
        let rank = u32::try_from(rank).expect("a rank read from a u32");
        let again = Hello {
            mesh: expected.mesh,
            world_size: expected.world_size,
            rank,
        };
        assert_eq!(again.encode(), raw, "an accepted hello is not canonical");
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
