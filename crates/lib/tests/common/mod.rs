//! Shared by the DockLib test binaries: two stacks over real regions made by the registry,
//! with the daemon's master thread between them (or a fast channel). No root needed.

#![allow(dead_code, unused_imports)]

use docknet_daemon::master::{self, MasterShared};
use docknet_daemon::registry::Registry;
use docknet_lib::{Endpoint, Faults, Stack, StackConfig, TcpListener, TcpStream, UdpSocket};
use docknet_pipe::IdlePolicy;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

pub struct Net {
    _dir: tempfile::TempDir,
    pub master: Arc<MasterShared>,
    handles: Vec<thread::JoinHandle<()>>,
    /// The registry behind the pipes (to change them while traffic flows).
    pub reg: std::sync::Mutex<Registry>,
    pub a: Stack,
    pub b: Stack,
}

impl Drop for Net {
    fn drop(&mut self) {
        self.master.shutdown.store(true, Ordering::Release);
        self.master.poke();
        for h in self.handles.drain(..) {
            h.join().unwrap();
        }
    }
}

pub const B: Ipv4Addr = Ipv4Addr::new(10, 8, 0, 2);

pub fn net(fc: bool, mtu: u32) -> Net {
    net_with(fc, mtu, StackConfig::default())
}

/// A lossy, duplicating, reordering, delaying link (on both stacks' receive side).
pub fn faulty(seed: u64, drop_pct: u8) -> StackConfig {
    StackConfig {
        faults: Some(Faults {
            drop_pct,
            dup_pct: 5,
            reorder_pct: 5,
            max_delay: Duration::from_micros(300),
            seed,
        }),
        ..StackConfig::default()
    }
}

pub fn net_with(fc: bool, mtu: u32, cfg: StackConfig) -> Net {
    net_masters(fc, mtu, cfg, 1)
}

/// Pipes `a` and `b` (ids 0 and 1: with two or more masters, of different masters) served by
/// `masters` master threads.
pub fn net_masters(fc: bool, mtu: u32, cfg: StackConfig, masters: usize) -> Net {
    net_built(fc, mtu, cfg.clone(), cfg, masters)
}

/// [`net_with`], stack `a` configured by `cfg_a` and `b` by `cfg_b`.
pub fn net_two(fc: bool, mtu: u32, cfg_a: StackConfig, cfg_b: StackConfig) -> Net {
    net_built(fc, mtu, cfg_a, cfg_b, 1)
}

fn net_built(fc: bool, mtu: u32, cfg_a: StackConfig, cfg_b: StackConfig, masters: usize) -> Net {
    let dir = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(dir.path(), None).unwrap();
    r.create_pipe("a", "10.8.0.1/24", Some(mtu), None).unwrap();
    r.create_pipe("b", "10.8.0.2/24", Some(mtu), None).unwrap();
    if fc {
        r.connect_fc("a", "b", None).unwrap();
    }
    let master = Arc::new(MasterShared::with_masters(r.snapshot(), masters));
    let handles = (0..masters)
        .map(|k| {
            let m = master.clone();
            thread::spawn(move || master::run_shard(m, k, IdlePolicy::ADAPTIVE, None))
        })
        .collect();
    let a = Stack::new(
        Endpoint::from_connection(r.connect_local("a").unwrap(), cfg_a.idle, None).unwrap(),
        cfg_a,
    );
    let b = Stack::new(
        Endpoint::from_connection(r.connect_local("b").unwrap(), cfg_b.idle, None).unwrap(),
        cfg_b,
    );
    Net {
        _dir: dir,
        master,
        handles,
        reg: std::sync::Mutex::new(r),
        a,
        b,
    }
}

/// FNV-1a over a stream of bytes.
pub fn fnv(h: &mut u64, data: &[u8]) {
    for b in data {
        *h ^= u64::from(*b);
        *h = h.wrapping_mul(0x100000001b3);
    }
}

pub fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(2654435761) >> 13) as u8
}

/// Streams `total` bytes a -> b through port `port`; the receiver checks every byte against the
/// pattern (content and order) and both ends compare an FNV-1a checksum of the payload.
pub fn transfer(n: &Net, port: u16, total: u64) {
    // A stalled connection fails within this deadline, saying where each side stood, instead
    // of hanging the test run.
    const DEADLINE: Duration = Duration::from_secs(120);
    let (da, db) = (n.a.clone(), n.b.clone());
    let diag = move || {
        format!(
            "device a {:?}, device b {:?}",
            da.device_stats(),
            db.device_stats()
        )
    };
    let diag2 = diag.clone();
    let mut l = TcpListener::bind(&n.b, port).unwrap();
    let rx = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(DEADLINE));
        let mut buf = vec![0u8; 64 * 1024];
        let (mut got, mut h) = (0u64, 0xcbf29ce484222325u64);
        loop {
            let k = s.read(&mut buf).unwrap_or_else(|e| {
                panic!(
                    "receiver at byte {got} ({}): {e}; {}",
                    s.tcp_state(),
                    diag2()
                )
            });
            if k == 0 {
                break;
            }
            for (j, b) in buf[..k].iter().enumerate() {
                assert_eq!(
                    *b,
                    pattern(got + j as u64),
                    "byte {} corrupted",
                    got + j as u64
                );
            }
            fnv(&mut h, &buf[..k]);
            got += k as u64;
        }
        (got, h)
    });
    let mut s = TcpStream::connect(&n.a, SocketAddrV4::new(B, port)).unwrap();
    s.set_write_timeout(Some(DEADLINE));
    let (mut sent, mut h) = (0u64, 0xcbf29ce484222325u64);
    let mut chunk = vec![0u8; 60_000];
    while sent < total {
        let k = chunk.len().min((total - sent) as usize);
        for (j, b) in chunk[..k].iter_mut().enumerate() {
            *b = pattern(sent + j as u64);
        }
        s.write_all(&chunk[..k]).unwrap_or_else(|e| {
            panic!("sender at byte {sent} ({}): {e}; {}", s.tcp_state(), diag())
        });
        fnv(&mut h, &chunk[..k]);
        sent += k as u64;
    }
    s.shutdown_write();
    let (got, hr) = rx.join().unwrap();
    assert_eq!(got, total);
    assert_eq!(hr, h, "checksum of the payload at the receiver");
}
