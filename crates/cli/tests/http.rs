//! docknet-httpd and docknet-load as programs: the protocol over kernel sockets (status,
//! headers, bodies, pipelining, bad requests), and both over DockNet in containers, where the
//! generator's counts must match the server's exactly.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A loopback port free now and handed to no other test of this process: ports the kernel
/// picks (`bind` to port 0, then released) can be picked again by a test running beside,
/// and two servers would then share one port (one fails to bind, the other test talks to
/// the wrong server and stops it).
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    loop {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        // a range of its own per process; within it, never the same port twice; below the
        // kernel's ephemeral ports (32768 up here), which an outgoing connection may take
        let port = u16::try_from(10_000 + ((std::process::id() % 1000) * 20 + k) % 22_000).unwrap();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A kernel-socket httpd on a free loopback port, ended (SIGTERM) on drop.
struct Server {
    child: Option<Child>,
    port: u16,
}

impl Server {
    fn start() -> Server {
        let port = free_port();
        // what it says goes to a file, for the failure message if it never listens
        let log = tempfile::tempfile().unwrap();
        let mut child = Command::new(HTTPD)
            .args(["--stack", "kernel", "--bind", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::piped())
            .stderr(log.try_clone().unwrap())
            .spawn()
            .unwrap();
        // under the whole suite's load a start can take seconds: wait up to 20 s, and say so
        // if it never listens (instead of letting the clients see a refusal)
        // a connect that finds no listener can still succeed: a socket whose ephemeral source
        // port is the port it connects to is connected to itself (TCP's simultaneous open)
        let listening = || {
            TcpStream::connect(("127.0.0.1", port))
                .is_ok_and(|s| s.local_addr().ok() != s.peer_addr().ok())
        };
        let t = std::time::Instant::now();
        while !listening() {
            let said = || {
                use std::io::Seek;
                let mut f = &log;
                let mut text = String::new();
                let _ = f.rewind().and_then(|_| f.read_to_string(&mut text));
                text
            };
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "docknet-httpd on port {port} exited before it listened ({status}): {}",
                    said()
                );
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "docknet-httpd did not listen on port {port} within 20 s; it said: {}",
                said()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Server {
            child: Some(child),
            port,
        }
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    /// Stops the server; what it said it served.
    fn stop(mut self) -> serde_json::Value {
        let c = self.child.take().unwrap();
        stop_json(c)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// SIGTERM to a server; the JSON line it prints on the way out.
fn stop_json(c: Child) -> serde_json::Value {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(c.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "the server exits cleanly on SIGTERM");
    let out = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(out.lines().last().unwrap_or("")).unwrap_or_else(|_| panic!("{out}"))
}

/// Reads one answer: status, headers (lower-case names), body.
fn answer(r: &mut impl BufRead) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut line = String::new();
    r.read_line(&mut line)
        .unwrap_or_else(|e| panic!("reading a status line: {e}"));
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no status line (the connection closed): {line:?}"))
        .parse()
        .unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').unwrap();
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map(|(_, v)| v.parse().unwrap())
        .unwrap();
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    (status, headers, body)
}

#[test]
fn pipelined_keep_alive_requests_get_their_bodies_in_order() {
    let srv = Server::start();
    let mut s = srv.connect();
    let reqs = "GET /hello.txt HTTP/1.1\r\nHost: t\r\n\r\n\
                GET /bytes/100000 HTTP/1.1\r\nHost: t\r\n\r\n\
                HEAD / HTTP/1.1\r\nHost: t\r\n\r\n\
                GET /nope HTTP/1.1\r\nHost: t\r\n\r\n\
                GET /work/100 HTTP/1.1\r\nHost: t\r\n\r\n";
    s.write_all(reqs.as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let (st, h, b) = answer(&mut r);
    assert_eq!(
        (st, b.as_slice()),
        (200, &b"hello from docknet-httpd\n"[..])
    );
    assert!(h
        .iter()
        .any(|(k, v)| k == "content-type" && v.starts_with("text/plain")));
    let (st, _, b) = answer(&mut r);
    assert!(st == 200 && b.len() == 100_000 && b.iter().all(|&c| c == b'x'));
    // HEAD: the length of the body it would send, and no body
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    let mut head = String::new();
    while line.trim_end() != "" {
        line.clear();
        r.read_line(&mut line).unwrap();
        head += &line;
    }
    assert!(head.contains("Content-Length: 451"), "{head}");
    let (st, _, _) = answer(&mut r);
    assert_eq!(st, 404);
    let (st, _, b) = answer(&mut r);
    assert_eq!((st, b.as_slice()), (200, &b"ok\n"[..]));
    drop((r, s));
    let served = srv.stop();
    assert_eq!(served["responses_2xx"], 4);
    assert_eq!(served["responses_4xx"], 1);
}

#[test]
fn malformed_requests_get_400_and_the_connection_closes_cleanly() {
    let srv = Server::start();
    for bad in [
        &b"NONSENSE\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: nope\r\n\r\n",
    ] {
        let mut s = srv.connect();
        s.write_all(bad).unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap(); // the server closes after its answer
        let text = String::from_utf8_lossy(&all);
        assert!(text.starts_with("HTTP/1.1 400 Bad Request"), "{text}");
        assert!(text.contains("Connection: close"), "{text}");
    }
    // an oversized head: 431, then closed
    let mut s = srv.connect();
    let big = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let _ = s.write_all(big.as_bytes());
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    assert!(String::from_utf8_lossy(&all).starts_with("HTTP/1.1 431"));
    // a 404 keeps the connection
    let mut s = srv.connect();
    s.write_all(
        b"GET /missing HTTP/1.1\r\nHost: t\r\n\r\nGET /hello.txt HTTP/1.1\r\nHost: t\r\n\r\n",
    )
    .unwrap();
    let mut r = BufReader::new(s);
    assert_eq!(answer(&mut r).0, 404);
    assert_eq!(answer(&mut r).0, 200);
    // the server still serves everyone else
    let mut s = srv.connect();
    s.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(answer(&mut BufReader::new(s)).0, 200);
}

#[test]
fn concurrent_clients_each_get_their_own_bytes() {
    let srv = Server::start();
    let port = srv.port;
    let clients: Vec<_> = (0..16)
        .map(|k| {
            std::thread::spawn(move || {
                let s = TcpStream::connect(("127.0.0.1", port))
                    .unwrap_or_else(|e| panic!("client {k}: connect to port {port}: {e}"));
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                for i in 0..50 {
                    let n = 1 + (k * 997 + i * 131) % 20_000;
                    write!(w, "GET /bytes/{n} HTTP/1.1\r\nHost: t\r\n\r\n")
                        .unwrap_or_else(|e| panic!("client {k}, request {i}: write: {e}"));
                    let (st, _, b) = answer(&mut r);
                    assert_eq!((st, b.len()), (200, n), "client {k}, request {i}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!(srv.stop()["responses_2xx"], 800);
}

#[test]
fn the_generator_counts_what_the_server_served_over_kernel_sockets() {
    let srv = Server::start();
    let o = Command::new(LOAD)
        .args([
            "--requests",
            "3000",
            "-c",
            "8",
            "-t",
            "2",
            "--pipeline",
            "4",
            "--json",
            &format!("http://127.0.0.1:{}/hello.txt", srv.port),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (r["requests"].as_u64(), r["ok"].as_u64()),
        (Some(3000), Some(3000)),
        "{r}"
    );
    assert!(r["errors"].as_object().unwrap().is_empty(), "{r}");
    assert_eq!(srv.stop()["responses_2xx"], 3000);
    // bad input: one line, non-zero
    for args in [
        &["ftp://x/"][..],
        &["http://name.example/"],
        &["-c", "0", "http://127.0.0.1:1/"],
    ] {
        let o = Command::new(LOAD).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.trim().lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}

const FORWARD: &str = env!("CARGO_BIN_EXE_docknet-forward");

/// docknet-forward between the generator and the server (Kratzke's ping service): pipelined
/// requests and large answers pass intact and are counted; what is not a request ends that
/// client's connection only.
#[test]
fn the_forwarder_passes_every_request_and_answer_and_refuses_garbage() {
    let srv = Server::start();
    let port = free_port();
    let fwd = Command::new(FORWARD)
        .args([
            "--stack",
            "kernel",
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--to",
            &format!("127.0.0.1:{}", srv.port),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(up, "the forwarder listens");
    // garbage first: that connection is closed, nothing reaches the server
    let mut bad = TcpStream::connect(("127.0.0.1", port)).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    bad.write_all(b"\x00\x01 not http\r\n\r\n").unwrap();
    let mut rest = Vec::new();
    let _ = bad.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{rest:?}");
    // a pipelined pair with a 300 kB answer, read back whole
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(
        b"GET /bytes/300000 HTTP/1.1\r\nHost: t\r\n\r\nGET /bytes/5 HTTP/1.1\r\nHost: t\r\n\r\n",
    )
    .unwrap();
    let mut r = BufReader::new(c);
    let (st1, _, b1) = answer(&mut r);
    let (st2, _, b2) = answer(&mut r);
    assert_eq!((st1, b1.len(), st2, b2.len()), (200, 300_000, 200, 5));
    drop(r);
    let o = Command::new(LOAD)
        .args([
            "--requests",
            "2000",
            "-c",
            "4",
            "--pipeline",
            "2",
            "--json",
            &format!("http://127.0.0.1:{port}/bytes/1000"),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let l: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(l["ok"].as_u64(), Some(2000), "{l}");
    let f = stop_json(fwd);
    assert_eq!(f["forwarded"], 2002, "{f}");
    assert_eq!(f["bad_requests"], 1, "{f}");
    assert_eq!(srv.stop()["responses_2xx"], 2002);
}

#[test]
fn httpd_and_load_over_docknet_agree_on_every_request() {
    if !root_or_skip("httpd over docknet") {
        return;
    }
    for fc in [false, true] {
        let mut lab = Lab::start("adaptive");
        lab.ok(&["pipe", "create", "web", "--ip", "10.61.0.2/24"]);
        lab.ok(&["pipe", "create", "cli", "--ip", "10.61.0.3/24"]);
        if fc {
            lab.ok(&["fc", "connect", "cli", "web"]);
        }
        let srv = lab.httpd_in("web", "10.61.0.2:80");
        let r = lab.load_in(
            "cli",
            &[
                "--requests",
                "5000",
                "-c",
                "16",
                "--pipeline",
                "2",
                "http://10.61.0.2/bytes/3000",
            ],
        );
        assert_eq!(
            (r["requests"].as_u64(), r["ok"].as_u64()),
            (Some(5000), Some(5000)),
            "{r}"
        );
        assert!(r["errors"].as_object().unwrap().is_empty(), "{r}");
        // every answer's bytes arrived: 5000 bodies of 3000 bytes, and their heads
        assert!(
            r["transfer_bytes_per_s"].as_f64().unwrap() * r["duration_s"].as_f64().unwrap()
                >= 5000.0 * 3000.0 * 0.999
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(lab.child_pid(srv) as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let out = lab.wait(srv, Duration::from_secs(10));
        let line = String::from_utf8_lossy(&out.stdout);
        let served: serde_json::Value = serde_json::from_str(line.lines().last().unwrap_or(""))
            .unwrap_or_else(|_| panic!("{line}"));
        assert_eq!(served["responses_2xx"], 5000, "fast channel: {fc}");
        assert_eq!(served["connections"], 16);
    }
}

/// Answers larger than DockLib's 256 KiB socket buffers keep filling the client's receive
/// window. Its scaled window is rounded down, so an advertisement could end a few bytes before
/// the previous one, and the server's last bytes of a burst were trimmed and recovered only by
/// the 1 s retransmission timeout (smoltcp's minimum): a few stalls of exactly 1 s every
/// second. Nothing is lost on a fast channel: no answer may take that long.
#[test]
fn large_answers_over_docknet_never_wait_for_a_retransmission_timeout() {
    if !root_or_skip("large answers over docknet") {
        return;
    }
    let mut lab = Lab::start("block");
    lab.ok(&[
        "pipe",
        "create",
        "web",
        "--ip",
        "10.62.0.2/24",
        "--mtu",
        "65535",
    ]);
    lab.ok(&[
        "pipe",
        "create",
        "cli",
        "--ip",
        "10.62.0.3/24",
        "--mtu",
        "65535",
    ]);
    lab.ok(&["fc", "connect", "cli", "web"]);
    // the server container ends with the lab
    lab.httpd_in("web", "10.62.0.2:80");
    let r = lab.load_in(
        "cli",
        &[
            "--requests",
            "3000",
            "-c",
            "1",
            "http://10.62.0.2/bytes/500000",
        ],
    );
    assert_eq!(r["ok"].as_u64(), Some(3000), "{r}");
    let max = r["max_us"].as_f64().unwrap();
    assert!(
        max < 900_000.0,
        "an answer took {max} us: a retransmission timeout on a path that loses nothing (p99 {} us, {} answers/s)",
        r["p99_us"],
        r["req_per_s"]
    );
}
