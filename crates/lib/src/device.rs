//! The smoltcp device over an [`Endpoint`]: the packet engine's bottom half.
//!
//! `receive` hands smoltcp the next frame (fast channels first, then the rx ring); `transmit`
//! gives it a buffer whose frame [`Endpoint::send`] routes by destination IP (fast channel to a
//! partner, else the pipe's tx ring). Frames are copied once each way between the rings and
//! these buffers, the copy the shared-memory boundary needs anyway (no slice into shared memory
//! is ever lent out; see `docknet_pipe::region`).

use crate::raw::{Endpoint, SendError};
use smoltcp::phy::{self, Checksum, ChecksumCapabilities, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use std::time::Duration;

/// Counters of the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Frames handed to the stack.
    pub rx: u64,
    /// Frames sent.
    pub tx: u64,
    /// Frames dropped because the ring stayed full (the stack retransmits).
    pub tx_dropped: u64,
}

/// A smoltcp [`phy::Device`] over a DockPipe endpoint.
#[derive(Debug)]
pub struct PipeDevice {
    /// The endpoint.
    pub ep: Endpoint,
    rx_buf: Vec<u8>,
    tx_buf: Vec<u8>,
    mtu: usize,
    checksums: bool,
    /// Counters.
    pub stats: DeviceStats,
}

impl PipeDevice {
    /// Wraps `ep`. With `checksums` false, IPv4/TCP/UDP checksums are neither computed nor
    /// checked: every path today is plain memory (daemon copy or fast channel), where a
    /// checksum protects nothing.
    pub fn new(ep: Endpoint, checksums: bool) -> PipeDevice {
        let frame = ep
            .frame_size()
            .max(ep.fc_peers().iter().map(|(_, f)| *f).max().unwrap_or(0));
        PipeDevice {
            mtu: ep.mtu() as usize,
            rx_buf: vec![0; frame.max(2048)],
            tx_buf: vec![0; frame.max(2048)],
            ep,
            checksums,
            stats: DeviceStats::default(),
        }
    }
}

/// A received frame (borrowed from the device's buffer).
#[derive(Debug)]
pub struct PipeRxToken<'a>(&'a [u8]);

impl phy::RxToken for PipeRxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0)
    }
}

/// A frame to send.
#[derive(Debug)]
pub struct PipeTxToken<'a> {
    ep: &'a mut Endpoint,
    buf: &'a mut Vec<u8>,
    stats: &'a mut DeviceStats,
}

impl phy::TxToken for PipeTxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        let r = f(&mut self.buf[..len]);
        let frame = &self.buf[..len];
        match self.ep.send(frame) {
            Ok(_) => self.stats.tx += 1,
            Err(SendError::Full) => {
                // Give the consumer a moment (it may be draining right now), then drop: TCP
                // retransmits, and a container must not stall on a peer that stopped reading.
                let deadline = std::time::Instant::now() + Duration::from_micros(200);
                match self.ep.send_blocking(frame, deadline) {
                    Ok(_) => self.stats.tx += 1,
                    Err(_) => self.stats.tx_dropped += 1,
                }
            }
            Err(_) => self.stats.tx_dropped += 1,
        }
        r
    }
}

impl phy::Device for PipeDevice {
    type RxToken<'a> = PipeRxToken<'a>;
    type TxToken<'a> = PipeTxToken<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(PipeRxToken<'_>, PipeTxToken<'_>)> {
        let (n, _) = self.ep.recv(&mut self.rx_buf)?;
        self.stats.rx += 1;
        Some((
            PipeRxToken(&self.rx_buf[..n]),
            PipeTxToken {
                ep: &mut self.ep,
                buf: &mut self.tx_buf,
                stats: &mut self.stats,
            },
        ))
    }

    fn transmit(&mut self, _now: Instant) -> Option<PipeTxToken<'_>> {
        Some(PipeTxToken {
            ep: &mut self.ep,
            buf: &mut self.tx_buf,
            stats: &mut self.stats,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.mtu + crate::frame::ETH;
        caps.max_burst_size = Some(64);
        if !self.checksums {
            let mut c = ChecksumCapabilities::ignored();
            c.ipv4 = Checksum::None;
            caps.checksum = c;
        }
        caps
    }
}
