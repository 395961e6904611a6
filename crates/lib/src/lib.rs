//! DockLib: what runs inside a container to use its DockPipe.
//!
//! [`raw::Endpoint`] is the packet engine's raw-frame layer: it attaches to the pipe the daemon
//! hands out on `@docknet/pipe` (or `$DOCKNET_PIPE`) in the container's network namespace, sends each Ethernet frame through a fast channel
//! when its destination IP belongs to a partner and through the pipe's tx ring otherwise, and
//! receives from the fast channels first, then from the rx ring (paper §3.3).
//!
//! [`stack::Stack`] runs smoltcp over that endpoint ([`device::PipeDevice`]); a background
//! engine thread keeps TCP alive while the application computes. [`tcp`] and [`udp`] have the
//! blocking std-like sockets: [`TcpListener`], [`TcpStream`] (`Read` + `Write`) and
//! [`UdpSocket`].
//! [`dns`] resolves host names through a name server reached over the pipe.
//! [`poll`] waits on many sockets at once; [`changes`] says which connections may have
//! changed since a reader last asked, so an event loop over many looks only at those.
//! [`callback`] offers the paper's run-to-completion style: `stack_rx` per frame and
//! `tcp_recved` per chunk of received bytes, called on the engine's own thread.

#![deny(unsafe_code)]

mod backlog;
mod buffers;
pub mod callback;
pub mod changes;
mod config;
pub mod device;
pub mod dns;
mod engine;
mod fastpath;
pub mod fork;
pub mod frame;
mod icmp;
pub mod poll;
pub mod raw;
mod records;
pub mod segment;
pub mod stack;
pub mod tcp;
pub mod udp;

pub use changes::SocketKey;
pub use device::Faults;
pub use poll::{Interest, Ready, Waited, Waker, Watch};
pub use raw::{AttachError, Endpoint, Route, SendError, Via};
pub use stack::{ForkHold, Stack, StackConfig, ACK_DELAY};
pub use tcp::{TcpListener, TcpStream};
pub use udp::UdpSocket;
