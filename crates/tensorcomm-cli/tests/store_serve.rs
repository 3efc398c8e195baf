//! `tensorcomm store serve` as a separate process.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use tensorcomm::store::{Store, TcpStore, TcpStoreOptions};
use tensorcomm::Error;

/// Kills the server when the test ends, passed or not.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `tensorcomm store serve` on a free port; returns it and its address.
fn serve(extra: &[&str], token: Option<&str>) -> (Server, String) {
    serve_on(&["--host", "127.0.0.1"], extra, token)
}

/// [`serve`] with `host_args` choosing where it listens.
fn serve_on(host_args: &[&str], extra: &[&str], token: Option<&str>) -> (Server, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tensorcomm"));
    command
        .args(["store", "serve", "--port", "0"])
        .args(host_args)
        .args(extra)
        .env_remove("TENSORCOMM_STORE_TOKEN")
        .env_remove("TENSORCOMM_BIND_ALL")
        .env_remove("MASTER_ADDR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(token) = token {
        command.env("TENSORCOMM_STORE_TOKEN", token);
    }
    let mut child = Server(command.spawn().unwrap());
    let stdout: ChildStdout = child.0.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr = line
        .trim_end()
        .strip_prefix("tensorcomm store listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    assert!(
        !addr.ends_with(":0"),
        "expected the real port, found {addr}"
    );
    (child, addr)
}

fn options(token: Option<&str>) -> TcpStoreOptions {
    TcpStoreOptions {
        timeout: Duration::from_secs(5),
        token: token.map(str::to_string),
        ..TcpStoreOptions::default()
    }
}

#[test]
fn serve_prints_its_address_and_serves() {
    let (_server, addr) = serve(&[], None);
    let a = TcpStore::connect(&addr, &options(None)).unwrap();
    let b = TcpStore::connect(&addr, &options(None)).unwrap();
    a.set("hello", b"world").unwrap();
    assert_eq!(b.get("hello").unwrap(), b"world");
    assert_eq!(b.add("count", 3).unwrap(), 3);
}

#[test]
fn serve_listens_on_loopback_unless_told_otherwise() {
    let (_server, addr) = serve_on(&[], &[], None);
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let (_server, addr) = serve_on(&["--host", "0.0.0.0"], &[], None);
    assert!(addr.starts_with("0.0.0.0:"), "{addr}");
}

#[test]
fn serve_requires_the_token_from_the_environment() {
    let (_server, addr) = serve(&[], Some("s3cret"));
    let err = TcpStore::connect(&addr, &options(Some("guess"))).unwrap_err();
    assert!(matches!(err, Error::StoreRefused { .. }), "{err}");
    let store = TcpStore::connect(&addr, &options(Some("s3cret"))).unwrap();
    store.set("k", b"v").unwrap();
    assert_eq!(store.get("k").unwrap(), b"v");
}

#[test]
fn serve_fails_when_the_world_does_not_join_in_time() {
    let (mut server, addr) = serve(&["--world-size", "2", "--timeout-secs", "1"], None);
    let _one = TcpStore::connect(&addr, &options(None)).unwrap();
    let status = server.0.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    let mut stderr = String::new();
    server
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains("1/2 clients joined"), "{stderr}");
}
