//! The stack's change log (`Stack::changes`, `Stack::wait_changes`): an event loop that looks
//! only at the connections the log names, as the preload library's `epoll_wait` does, misses
//! nothing.

mod common;
use common::*;
use docknet_lib::{Interest, SocketKey, TcpListener, TcpStream, Waited, Watch};
use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddrV4;
use std::thread;
use std::time::{Duration, Instant};

/// What one connection of the server is ready for now.
fn ready(st: &docknet_lib::Stack, c: &TcpStream) -> docknet_lib::Ready {
    let mut r = Vec::new();
    st.ready_now(&[Watch::Stream(c, Interest::READ)], &mut r);
    r.first().map(|x| x.1).unwrap_or_default()
}

#[test]
fn an_event_loop_that_looks_only_at_named_connections_serves_every_one() {
    let n = net(false, 1500);
    let listener = TcpListener::bind(&n.b, 7030).unwrap();
    let b = n.b.clone();
    // more sockets than smoltcp's set walks (32 slots): the egress list and the 4-tuple table
    const CLIENTS: usize = 40;
    const ROUNDS: usize = 40;
    let server = thread::spawn(move || {
        let mut conns: HashMap<SocketKey, TcpStream> = HashMap::new();
        // those ready at the last look stay to be looked at (level-triggered)
        let mut look: HashSet<SocketKey> = HashSet::new();
        let (mut cursor, mut done, mut looked, mut named) = (0u64, 0, 0usize, 0usize);
        let deadline = Instant::now() + Duration::from_secs(60);
        while done < CLIENTS {
            assert!(
                Instant::now() < deadline,
                "served {done} of {CLIENTS} in 60 s"
            );
            let whole = b.changes(&mut cursor, |k| {
                named += 1;
                look.insert(k);
            });
            if !whole {
                look.extend(conns.keys().copied());
            }
            while let Ok((c, _)) = listener.try_accept() {
                look.insert(c.key());
                conns.insert(c.key(), c);
            }
            let mut any = false;
            for k in std::mem::take(&mut look) {
                let Some(c) = conns.get(&k) else { continue };
                looked += 1;
                if !ready(&b, c).read {
                    continue;
                }
                any = true;
                let mut buf = [0u8; 4096];
                match c.try_read(&mut buf) {
                    Ok(0) => {
                        conns.remove(&k);
                        done += 1;
                    }
                    Ok(k2) => {
                        (&*c).write_all(&buf[..k2]).unwrap();
                        look.insert(k);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
            if !any {
                let r = b.wait_changes(cursor, Some(Duration::from_secs(10)), &[]);
                assert_eq!(r.unwrap(), Waited::Ready, "nothing changed for 10 s");
            }
        }
        (looked, named)
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|k| {
            let a = n.a.clone();
            thread::spawn(move || {
                let mut c = TcpStream::connect(&a, SocketAddrV4::new(B, 7030)).unwrap();
                let mut buf = [0u8; 100];
                for round in 0..ROUNDS {
                    let msg = [(k * 7 + round) as u8; 100];
                    c.write_all(&msg).unwrap();
                    c.read_exact(&mut buf).unwrap();
                    assert_eq!(buf, msg);
                    if round % 8 == 0 {
                        thread::sleep(Duration::from_millis(1));
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let (looked, named) = server.join().unwrap();
    assert!(named > 0, "the log named no connection");
    // the loop looked at what changed, not at every connection each time
    assert!(
        looked < CLIENTS * CLIENTS * ROUNDS / 4,
        "looked {looked} times for {} exchanges",
        CLIENTS * ROUNDS
    );
}

#[test]
fn a_reset_is_named_and_ends_a_wait_for_changes() {
    let n = net(true, 1500);
    let mut listener = TcpListener::bind(&n.b, 7031).unwrap();
    let client = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7031)).unwrap();
    let (server, _) = listener.accept().unwrap();
    let mut cursor = 0;
    assert!(
        !n.b.changes(&mut cursor, |_| {}),
        "a first read looks at all"
    );
    assert!(n.b.changes(&mut cursor, |_| {}));
    let key = server.key();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        client.abort();
    });
    let r = n.b.wait_changes(cursor, Some(Duration::from_secs(10)), &[]);
    assert_eq!(r.unwrap(), Waited::Ready);
    let mut keys = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !keys.contains(&key) {
        assert!(Instant::now() < deadline, "the reset was never named");
        assert!(n.b.changes(&mut cursor, |k| keys.push(k)));
        if !keys.contains(&key) {
            let _ = n.b.wait_changes(cursor, Some(Duration::from_secs(1)), &[]);
        }
    }
    let r = ready(&n.b, &server);
    assert!(r.read && r.hup, "{r:?}");
    let mut buf = [0u8; 8];
    let r = (&server).read(&mut buf);
    assert!(r.is_err() || r.unwrap() == 0, "a read after the reset");
    t.join().unwrap();
}

#[test]
fn a_reader_that_fell_behind_the_log_is_told_to_look_at_everything() {
    let n = net(true, 1500);
    let mut listener = TcpListener::bind(&n.b, 7032).unwrap();
    let client = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7032)).unwrap();
    let (_server, _) = listener.accept().unwrap();
    let (mut slow, mut fast) = (0, 0);
    n.a.changes(&mut slow, |_| {});
    n.a.changes(&mut fast, |_| {});
    assert!(n.a.changes(&mut slow, |_| {}));
    // another reader takes each change as it comes: one entry each
    for _ in 0..5000 {
        (&client).write_all(b"x").unwrap();
        assert!(n.a.changes(&mut fast, |_| {}));
    }
    assert!(
        !n.a.changes(&mut slow, |_| {}),
        "five thousand changes since, more than the log keeps"
    );
    assert!(n.a.changes(&mut slow, |_| {}), "and caught up again");
}
