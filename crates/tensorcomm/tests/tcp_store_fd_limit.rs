//! A TCP store server whose process has few file descriptors: past its
//! connection cap (lowered to fit the open-file limit), clients are told so
//! at once, instead of waiting in the kernel's queue for a server that can
//! no longer accept (it used to run out of descriptors first: 20,000 held
//! connections, and a good client timed out).
//!
//! The server runs in a child process (this test binary again) started
//! under `ulimit -S -n 512`, so that the test's own sockets do not count.

#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use tensorcomm::store::{Store, TcpStore, TcpStoreOptions, TcpStoreServer};

const CHILD: &str = "TCMSTORE_FD_LIMIT_CHILD";
const MAGIC: &[u8; 8] = b"TCMSTORE";
const FILES: usize = 512;

/// In the child: serves until its stdin closes.
#[test]
fn child_server_entry() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let server = TcpStoreServer::bind("127.0.0.1:0", &TcpStoreOptions::default()).unwrap();
    println!("listening {}", server.local_addr());
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    std::process::exit(0);
}

/// Sends a hello; returns the handshake's (status, reason).
fn handshake(addr: SocketAddr) -> (TcpStream, u8, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&1u32.to_le_bytes()); // version
    hello.extend_from_slice(&0u32.to_le_bytes()); // flags: not joining
    hello.extend_from_slice(&0u32.to_le_bytes()); // no token
    stream.write_all(&hello).unwrap();
    let mut head = [0u8; 17];
    stream
        .read_exact(&mut head)
        .expect("expected a handshake reply (accepted or refused), the read failed");
    let len = u32::from_le_bytes(head[13..17].try_into().unwrap()) as usize;
    let mut reason = vec![0u8; len];
    stream.read_exact(&mut reason).unwrap();
    (stream, head[12], String::from_utf8(reason).unwrap())
}

#[test]
fn past_the_open_file_limit_clients_are_refused_clearly_not_left_hanging() {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -S -n {FILES} && exec \"$0\" \"$@\""))
        .arg(exe)
        .args(["--exact", "child_server_entry", "--nocapture"])
        .env(CHILD, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr: SocketAddr = lines
        .find_map(|l| l.unwrap().strip_prefix("listening ").map(str::to_string))
        .expect("the child server's address")
        .parse()
        .unwrap();
    let mut accepted = Vec::new();
    let mut refusals = Vec::new();
    for _ in 0..FILES + 100 {
        let (stream, status, reason) = handshake(addr);
        if status == 0 {
            accepted.push(stream);
        } else {
            refusals.push(reason);
        }
    }
    assert_eq!(accepted.len(), 384, "512 files less a reserve of 128");
    assert_eq!(refusals.len(), FILES + 100 - 384);
    assert!(
        refusals[0].contains("open-file limit of 512"),
        "{}",
        refusals[0]
    );
    // Once connections close, a good client gets in.
    accepted.truncate(100);
    let options = TcpStoreOptions {
        timeout: Duration::from_secs(20),
        token: None,
        ..TcpStoreOptions::default()
    };
    let client = TcpStore::connect(&addr.to_string(), &options).unwrap();
    client.set("k", b"v").unwrap();
    assert_eq!(client.get("k").unwrap(), b"v");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}
