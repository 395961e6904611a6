//! Ping-pong over DockLib: `pingpong server PORT` in one container, `pingpong client IP:PORT N`
//! in another; the client prints the median round trip of N 64-byte exchanges.

use docknet_lib::{Stack, StackConfig, TcpListener, TcpStream};
use std::io::{Read, Write};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let stack = Stack::attach_default(StackConfig::default())?;
    match args.get(1).map(String::as_str) {
        Some("server") => {
            let port: u16 = args.get(2).ok_or("port?")?.parse()?;
            let (mut c, _) = TcpListener::bind(&stack, port)?.accept()?;
            let mut m = [0u8; 64];
            while c.read_exact(&mut m).is_ok() {
                c.write_all(&m)?;
            }
        }
        Some("client") => {
            let mut c = TcpStream::connect(
                &stack,
                args.get(2)
                    .ok_or("IP:PORT?")?
                    .parse::<std::net::SocketAddr>()?,
            )?;
            let n: usize = args.get(3).map_or(Ok(10_000), |s| s.parse())?;
            let mut rtts = Vec::with_capacity(n);
            let mut m = [7u8; 64];
            for _ in 0..n {
                let t = Instant::now();
                c.write_all(&m)?;
                c.read_exact(&mut m)?;
                rtts.push(t.elapsed());
            }
            rtts.sort();
            println!("{n} round trips, median {:?}", rtts[n / 2]);
        }
        _ => return Err("usage: pingpong server PORT | pingpong client IP:PORT [N]".into()),
    }
    Ok(())
}
