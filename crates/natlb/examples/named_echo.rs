//! A test backend for the balancer: a DockLib echo server that tells who it is. On every
//! connection it first writes its name and a newline, then echoes every byte back.
//!
//! ```sh
//! docknet run --pipe web1 -- target/release/examples/named_echo web1 80
//! ```

use docknet_lib::{Stack, StackConfig, TcpListener};
use std::io::{Read, Write};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(name), Some(port)) = (args.next(), args.next().and_then(|p| p.parse().ok())) else {
        eprintln!("usage: named_echo NAME PORT");
        std::process::exit(2);
    };
    if let Err(e) = serve(&name, port) {
        eprintln!("named_echo: {e}");
        std::process::exit(1);
    }
}

fn serve(name: &str, port: u16) -> std::io::Result<()> {
    let stack = Stack::attach_default(StackConfig::default()).map_err(std::io::Error::other)?;
    let mut listener = TcpListener::bind(&stack, port)?;
    eprintln!("named_echo {name} on {}", listener.local_addr());
    loop {
        let (mut conn, _) = listener.accept()?;
        let hello = format!("{name}\n");
        // one thread per connection: the stack is shared and thread-safe
        std::thread::spawn(move || {
            if conn.write_all(hello.as_bytes()).is_err() {
                return;
            }
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if conn.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
        });
    }
}
