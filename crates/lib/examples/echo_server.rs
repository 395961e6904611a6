//! An echo server on DockLib sockets. Run it in a container attached to a pipe:
//!
//! ```sh
//! docknet run --pipe b -- target/release/examples/echo_server 7
//! ```

use docknet_lib::{Stack, StackConfig, TcpListener};
use std::io::{Read, Write};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "7".into())
        .parse()?;
    let stack = Stack::attach_default(StackConfig::default())?;
    let mut listener = TcpListener::bind(&stack, port)?;
    eprintln!("echo server on {}", listener.local_addr());
    loop {
        let (mut conn, peer) = listener.accept()?;
        // one thread per connection: the stack is shared and thread-safe
        std::thread::spawn(move || {
            let mut buf = [0u8; 16 * 1024];
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
            eprintln!("{peer} done");
        });
    }
}
