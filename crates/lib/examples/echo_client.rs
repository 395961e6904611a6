//! Sends each line of stdin to an echo server and prints what comes back.
//!
//! ```sh
//! echo hello | docknet run --pipe a -- target/release/examples/echo_client 10.0.0.3:7
//! ```

use docknet_lib::{Stack, StackConfig, TcpStream};
use std::io::{BufRead, Read, Write};
use std::net::SocketAddrV4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddrV4 = std::env::args()
        .nth(1)
        .ok_or("usage: echo_client IP:PORT")?
        .parse()?;
    let stack = Stack::attach_default(StackConfig::default())?;
    let mut conn = TcpStream::connect(&stack, addr)?;
    for line in std::io::stdin().lock().lines() {
        let line = line? + "\n";
        conn.write_all(line.as_bytes())?;
        let mut back = vec![0u8; line.len()];
        conn.read_exact(&mut back)?;
        print!("{}", String::from_utf8_lossy(&back));
    }
    Ok(())
}
