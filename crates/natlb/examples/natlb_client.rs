//! A scripted test client for the balancer (DockLib sockets, run in a container). It holds
//! connections to one address and takes one command per line on stdin, answering each with one
//! JSON line on stdout:
//!
//! - `open N`: opens N connections one after another; each server names itself first
//!   (`named_echo`). Answers `{"opened":[NAME or null, ...]}`.
//! - `echo BYTES`: on every live connection in turn, sends BYTES bytes of a pattern of its own
//!   (16 KiB at a time) and checks every byte that comes back. Answers
//!   `{"echo":[{"backend":NAME,"ok":true|false,"error":...}, ...]}`; a failed connection is
//!   dropped.
//! - `close NAME`: closes the live connections to backend NAME. Answers `{"closed":K}`.
//! - `quit`.
//!
//! ```sh
//! docknet run --pipe client -- target/release/examples/natlb_client 10.0.0.1:80
//! ```

use docknet_lib::{Stack, StackConfig, TcpStream};
use std::io::{BufRead, Read, Write};
use std::net::SocketAddrV4;
use std::time::Duration;

struct Conn {
    name: String,
    stream: TcpStream,
    id: usize,
}

fn main() {
    let Some(addr) = std::env::args()
        .nth(1)
        .and_then(|a| a.parse::<SocketAddrV4>().ok())
    else {
        eprintln!("usage: natlb_client IP:PORT  (then commands on stdin)");
        std::process::exit(2);
    };
    let stack = match Stack::attach_default(StackConfig::default()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("natlb_client: {e}");
            std::process::exit(1);
        }
    };
    let mut conns: Vec<Conn> = Vec::new();
    let mut next_id = 0;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut w = line.split_whitespace();
        let out = match (w.next(), w.next()) {
            (Some("open"), Some(n)) => {
                let n: usize = n.parse().unwrap_or(0);
                let mut names = Vec::new();
                for _ in 0..n {
                    match open(&stack, addr) {
                        Ok((name, stream)) => {
                            names.push(serde_json::Value::from(name.clone()));
                            conns.push(Conn {
                                name,
                                stream,
                                id: next_id,
                            });
                            next_id += 1;
                        }
                        Err(e) => {
                            eprintln!("open: {e}");
                            names.push(serde_json::Value::Null);
                        }
                    }
                }
                serde_json::json!({ "opened": names })
            }
            (Some("echo"), Some(n)) => {
                let n: usize = n.parse().unwrap_or(0);
                let mut results = Vec::new();
                conns.retain_mut(|c| {
                    let r = echo(c, n);
                    results.push(serde_json::json!({
                        "backend": c.name,
                        "ok": r.is_ok(),
                        "error": r.as_ref().err().map(|e| format!("{:?}: {e}", e.kind())),
                    }));
                    r.is_ok()
                });
                serde_json::json!({ "echo": results })
            }
            (Some("close"), Some(name)) => {
                let before = conns.len();
                conns.retain_mut(|c| {
                    if c.name == name {
                        c.stream.shutdown_write();
                        // drain the server's FIN
                        let mut b = [0u8; 64];
                        c.stream.set_read_timeout(Some(Duration::from_secs(2)));
                        while matches!(c.stream.read(&mut b), Ok(n) if n > 0) {}
                        false
                    } else {
                        true
                    }
                });
                serde_json::json!({ "closed": before - conns.len() })
            }
            (Some("quit"), _) => break,
            _ => serde_json::json!({ "error": format!("unknown command {line:?}") }),
        };
        println!("{out}");
        let _ = std::io::stdout().flush();
    }
}

/// Connects and reads the server's name.
fn open(stack: &Stack, addr: SocketAddrV4) -> std::io::Result<(String, TcpStream)> {
    let mut s = TcpStream::connect(stack, addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut name = Vec::new();
    let mut b = [0u8; 1];
    while name.len() < 64 {
        if s.read(&mut b)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if b[0] == b'\n' {
            return Ok((String::from_utf8_lossy(&name).into_owned(), s));
        }
        name.push(b[0]);
    }
    Err(std::io::Error::other("no name line"))
}

/// The pattern byte at offset `i` of connection `id`'s stream.
fn pattern(id: usize, i: usize) -> u8 {
    (i.wrapping_mul(31) ^ id.wrapping_mul(131) ^ (i >> 8)) as u8
}

fn echo(c: &mut Conn, n: usize) -> std::io::Result<()> {
    const CHUNK: usize = 16 * 1024;
    let mut sent = 0;
    let mut buf = vec![0u8; CHUNK];
    while sent < n {
        let k = CHUNK.min(n - sent);
        let out: Vec<u8> = (sent..sent + k).map(|i| pattern(c.id, i)).collect();
        c.stream.write_all(&out)?;
        let mut got = 0;
        while got < k {
            let m = c.stream.read(&mut buf[..k - got])?;
            if m == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            for (j, &x) in buf[..m].iter().enumerate() {
                if x != pattern(c.id, sent + got + j) {
                    return Err(std::io::Error::other(format!(
                        "byte {} differs",
                        sent + got + j
                    )));
                }
            }
            got += m;
        }
        sent += k;
    }
    Ok(())
}
