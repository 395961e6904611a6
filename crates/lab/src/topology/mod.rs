//! Topologies: what connects a client and a server in each mode, built fresh in namespaces
//! (or on a daemon) of the lab's own and removed on drop, also on failure or Ctrl-C.
//!
//! - [`kernel`]: one function per kernel mode (`ip`, the CNI plugins, OVS);
//! - [`cni`]: a small CNI 1.0 runtime over the reference plugins;
//! - [`ovs`]: an Open vSwitch of the lab's own;
//! - [`daemon`]: a DockNet daemon of the lab's own;
//! - [`docknet`]: pipes (and fast channels) on that daemon;
//! - [`pods`]: DockNet pods on two hosts through the CNI plugin and the node agent;
//! - [`probe`]: whether this machine can have a mode at all;
//! - [`wire`]: two hosts joined by a wire (the two-host modes build on it);
//! - [`tunnel`]: an encrypted tunnel between the two hosts (OpenVPN, static key).

pub mod cni;
pub mod daemon;
pub mod docknet;
pub mod kernel;
pub mod ovs;
pub mod pods;
pub mod probe;
pub mod tunnel;
pub mod wire;

pub use daemon::Daemon;
pub use docknet::DocknetLab;
pub use kernel::{KernelLab, Pair};
