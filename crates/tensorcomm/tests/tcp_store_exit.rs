//! A hosting store at process exit: a process that hosts the store (rank
//! 0) and ends with `std::process::exit`, or returns from `main` with the
//! store still held, keeps serving the clients of other processes until
//! they disconnect (at most its linger), and exits at once when none is
//! connected, when its store was dropped, or when it hosts none. A child
//! that `fork()` made does not wait on its parent's server.
//!
//! Each case runs the hosting process as a child (this test binary again,
//! told what to do through `CHILD_MODE`); the test is its other process.

#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::store::{Store, TcpStore, TcpStoreOptions};

const CHILD_MODE: &str = "TCMSTORE_EXIT_CHILD";
/// The child's linger: far longer than any wait the tests accept, so that
/// an exit that waited for it shows.
const LINGER: Duration = Duration::from_secs(30);
/// What "at once" and "promptly" mean here (the child's whole life, or
/// the time from the last client leaving to its exit).
const PROMPTLY: Duration = Duration::from_secs(5);

fn options() -> TcpStoreOptions {
    TcpStoreOptions {
        timeout: Duration::from_secs(20),
        linger: LINGER,
        ..TcpStoreOptions::default()
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// Blocks until the parent writes a line (or closes stdin).
fn wait_for_go() {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// Hosts a store, sets `k`, and says where it listens.
fn host() -> TcpStore {
    let store = TcpStore::host("127.0.0.1:0", 1, &options()).unwrap();
    store.set("k", b"v").unwrap();
    say(&format!("addr {}", store.server_addr()));
    store
}

/// [`host`], with a thread of this process blocked in a get on the store
/// (one of its connections out of the pool) as long as the process lives.
fn host_in_use() -> Arc<TcpStore> {
    let store = Arc::new(host());
    let waiter = store.clone();
    thread::spawn(move || waiter.get_timeout("never", Duration::from_secs(120)));
    // Not a synchronisation: the tests pass either way; this makes the
    // get likely to be in flight.
    thread::sleep(Duration::from_millis(50));
    store
}

/// In the child: what `CHILD_MODE` says.
#[test]
fn child_entry() {
    let Ok(mode) = std::env::var(CHILD_MODE) else {
        return;
    };
    match mode.as_str() {
        "exit" => {
            let _store = host_in_use();
            wait_for_go();
            say("exiting");
            std::process::exit(3);
        }
        "return" => {
            // As if a thread that is never joined held the store: nothing
            // drops it before the process ends.
            std::mem::forget(host_in_use());
            wait_for_go();
            say("returning");
        }
        "fork" => {
            let _store = host_in_use();
            wait_for_go();
            say(&format!(
                "forked child took_ms {}",
                fork_and_exit().as_millis()
            ));
            std::process::exit(3);
        }
        "drop" => {
            let store = host();
            wait_for_go();
            say("dropping");
            drop(store);
            std::process::exit(3);
        }
        "dropped" => {
            drop(host());
            std::process::exit(3);
        }
        "none" => std::process::exit(3),
        other => panic!("{CHILD_MODE}={other:?}"),
    }
}

/// Forks a child that calls `exit` (running the inherited exit handler)
/// at once; returns how long it took to end.
fn fork_and_exit() -> Duration {
    let started = Instant::now();
    // SAFETY: the child calls only `exit`, which runs the atexit handlers.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: ends the forked child, running the atexit handlers.
        unsafe { libc::exit(5) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above; `status` is a valid int.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 5);
    started.elapsed()
}

/// A child process of this test binary, its stdout read line by line.
struct Hosting {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: std::io::Lines<BufReader<ChildStdout>>,
    started: Instant,
}

impl Hosting {
    fn start(mode: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD_MODE, mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the hosting child");
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Hosting {
            child,
            stdin,
            lines,
            started: Instant::now(),
        }
    }

    /// What follows `prefix` on the first line that holds it (libtest may
    /// have written the test's name on the line first).
    fn line(&mut self, prefix: &str) -> String {
        self.lines
            .find_map(|l| Some(l.unwrap().split_once(prefix)?.1.to_string()))
            .unwrap_or_else(|| panic!("the child never said {prefix:?}"))
    }

    fn go(&mut self) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "go").unwrap();
        stdin.flush().unwrap();
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Its exit status, which must come within `limit`.
    fn exit_within(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("the child still ran {limit:?} later (its linger is {LINGER:?})");
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Hosting {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child begins to end (`mode`: `exit(3)`, a return from main (status
/// 0), or dropping its store then `exit(3)`) while this process holds a
/// connection: the store still answers, and the child ends promptly once
/// this client disconnects.
fn serves_until_the_other_clients_leave(mode: &str, said: &str, code: i32) {
    let mut child = Hosting::start(mode);
    let addr = child.line("addr ");
    let client = TcpStore::connect(&addr, &options()).unwrap();
    child.go();
    child.line(said);
    thread::sleep(Duration::from_millis(300));
    assert!(
        child.running(),
        "the hosting child ended with a client of another process still connected"
    );
    assert_eq!(client.get("k").unwrap(), b"v");
    client.set("late", b"still served").unwrap();
    assert_eq!(client.get("late").unwrap(), b"still served");
    drop(client);
    let status = child.exit_within(PROMPTLY);
    assert_eq!(status.code(), Some(code), "{status}");
}

#[test]
fn a_hosting_store_serves_through_process_exit_until_other_processes_disconnect() {
    serves_until_the_other_clients_leave("exit", "exiting", 3);
}

#[test]
fn a_hosting_store_serves_through_a_return_from_main_until_other_processes_disconnect() {
    serves_until_the_other_clients_leave("return", "returning", 0);
}

/// Dropping the store still lingers for the other clients, and the exit
/// after it (the server stopped) adds no wait of its own.
#[test]
fn a_dropped_hosting_store_lingers_and_the_exit_after_it_does_not() {
    serves_until_the_other_clients_leave("drop", "dropping", 3);
}

/// Connections of the hosting process itself (its pool, a thread blocked
/// in a get) do not hold its exit.
#[test]
fn a_hosting_process_with_no_other_client_exits_at_once() {
    let mut child = Hosting::start("exit");
    child.line("addr ");
    child.go();
    let status = child.exit_within(PROMPTLY);
    assert_eq!(status.code(), Some(3), "{status}");
}

/// A dropped hosting store (already lingered and stopped) and no store at
/// all leave nothing to wait for.
#[test]
fn exit_is_not_delayed_without_a_running_hosted_store() {
    for mode in ["dropped", "none"] {
        let mut child = Hosting::start(mode);
        let status = child.exit_within(PROMPTLY);
        assert_eq!(status.code(), Some(3), "{mode}: {status}");
        assert!(child.started.elapsed() < PROMPTLY, "{mode}");
    }
}

/// A child forked from the hosting process inherits the exit handler but
/// not the server: its exit does not wait for the server's clients.
#[test]
fn a_forked_child_does_not_wait_on_its_parents_store() {
    let mut child = Hosting::start("fork");
    let addr = child.line("addr ");
    let client = TcpStore::connect(&addr, &options()).unwrap();
    child.go();
    let took: u64 = child.line("forked child took_ms ").parse().unwrap();
    assert!(
        Duration::from_millis(took) < PROMPTLY,
        "the forked child took {took} ms to exit"
    );
    drop(client);
    let status = child.exit_within(PROMPTLY);
    assert_eq!(status.code(), Some(3), "{status}");
}
