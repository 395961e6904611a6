//! dnperf's workloads over kernel sockets on loopback (no root): every workload produces sane
//! figures, and the stream's receiver-side count matches what was sent.

use docknet_perf::net::{kernel_mtu, KernelNet};
use docknet_perf::stats::now_ns;
use docknet_perf::workload::{client, client_udp, serve, serve_udp, Pace, Workload};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

const D: Duration = Duration::from_millis(300);
const W: Duration = Duration::from_millis(100);

fn pace(interval: Duration) -> Pace {
    Pace {
        duration: D,
        warmup: W,
        interval,
        start_at: None,
    }
}

#[test]
fn tcp_rr_and_stream() {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 47311));
    let srv = std::thread::spawn(move || serve(&KernelNet, addr, 2).unwrap());
    let rr = client(&KernelNet, addr, Workload::Rr, 64, pace(Duration::ZERO)).unwrap();
    assert!(rr.transactions > 100, "{rr:?}");
    assert!(
        rr.request_ns.is_none(),
        "only paced rr reports requests alone"
    );
    let ow = rr.one_way_ns.unwrap();
    assert!(ow.count == 2 * rr.transactions && ow.p50 > 0 && ow.p50 <= ow.p99 && ow.p99 <= ow.max);
    assert!(rr.half_rtt_ns.unwrap().p50 > 0 && rr.cpu_s_per_op > 0.0);
    let st = client(
        &KernelNet,
        addr,
        Workload::Stream,
        16384,
        pace(Duration::ZERO),
    )
    .unwrap();
    assert!(st.gbps.unwrap() > 0.01 && st.bytes.unwrap() > 0, "{st:?}");
    let handled = srv.join().unwrap();
    // the server counted rr transactions (warm-up included) and the stream's measured bytes
    assert!(handled >= rr.transactions + st.bytes.unwrap());
}

#[test]
fn paced_rr_pauses_between_transactions_and_reports_requests() {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 47313));
    let srv = std::thread::spawn(move || serve(&KernelNet, addr, 1).unwrap());
    std::thread::sleep(Duration::from_millis(100));
    let pause = Duration::from_millis(50);
    let rr = client(&KernelNet, addr, Workload::Rr, 64, pace(pause)).unwrap();
    // 300 ms measured with a 50 ms pause after each: about 6 transactions, never hundreds
    assert!((3..=8).contains(&rr.transactions), "{rr:?}");
    let req = rr.request_ns.expect("paced rr reports requests alone");
    assert_eq!(req.count, rr.transactions);
    assert!(req.p50 > 0 && req.p50 <= req.max);
    srv.join().unwrap();
}

#[test]
fn a_client_given_a_start_time_waits_for_it_after_connecting_and_says_how_late_it_was() {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 47314));
    let srv = std::thread::spawn(move || serve(&KernelNet, addr, 2).unwrap());
    std::thread::sleep(Duration::from_millis(100));
    let t = std::time::Instant::now();
    let at = Pace {
        start_at: Some(now_ns() + 400_000_000),
        ..pace(Duration::ZERO)
    };
    let rr = client(&KernelNet, addr, Workload::Rr, 64, at).unwrap();
    // 400 ms waiting, then 100 ms warm-up and 300 ms measured
    assert!(
        t.elapsed() >= Duration::from_millis(800),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(rr.late_ms, Some(0.0));
    let past = Pace {
        start_at: Some(now_ns() - 50_000_000),
        ..pace(Duration::ZERO)
    };
    let rr = client(&KernelNet, addr, Workload::Rr, 64, past).unwrap();
    assert!(rr.late_ms.unwrap() >= 50.0, "{rr:?}");
    srv.join().unwrap();
}

#[test]
fn udp_rr_and_stream() {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 47312));
    let srv = std::thread::spawn(move || serve_udp(&KernelNet, addr, 2).unwrap());
    std::thread::sleep(Duration::from_millis(100));
    let rr = client_udp(&KernelNet, addr, Workload::Rr, 64, D, W).unwrap();
    assert!(rr.transactions > 100, "{rr:?}");
    let st = client_udp(&KernelNet, addr, Workload::Stream, 1200, D, W).unwrap();
    assert!(st.gbps.unwrap() > 0.0, "{st:?}");
    srv.join().unwrap();
}

#[test]
fn loopback_mtu_is_found() {
    assert!(kernel_mtu(Ipv4Addr::LOCALHOST).is_some_and(|m| m >= 1500));
    assert_eq!(kernel_mtu(Ipv4Addr::new(192, 0, 2, 99)), None);
}
