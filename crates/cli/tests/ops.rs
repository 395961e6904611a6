//! What operators use on a live daemon, with real containers: the Prometheus endpoint, packet
//! capture read back by tcpdump, and `docknet top --once --json`.

mod common;
use common::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on 127.0.0.1:port: (status line, body).
fn get(port: u16, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP reply");
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// Samples by metric name and labels, as Prometheus reads them.
/// Samples keyed by metric name and sorted labels.
type Samples = HashMap<(String, Vec<(String, String)>), f64>;

fn scrape(port: u16) -> Samples {
    let (status, body) = get(port, "/metrics");
    assert!(status.contains("200"), "{status}");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let parsed = prometheus_parse::Scrape::parse(lines).expect("the exposition parses");
    parsed
        .samples
        .into_iter()
        .map(|s| {
            let mut labels: Vec<(String, String)> = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            labels.sort();
            let v = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            };
            ((s.metric, labels), v)
        })
        .collect()
}

fn sample(m: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut l: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.sort();
    *m.get(&(name.to_string(), l))
        .unwrap_or_else(|| panic!("no sample {name}{labels:?}"))
}

/// Two pipes, an HTTP server in `web` (attached and listening when this returns).
fn web(lab: &mut Lab, net: u8) -> (usize, String) {
    let (ws, cs) = (format!("10.{net}.0.2"), format!("10.{net}.0.3"));
    lab.ok(&["pipe", "create", "web", "--ip", &format!("{ws}/24")]);
    lab.ok(&["pipe", "create", "cli", "--ip", &format!("{cs}/24")]);
    let srv = lab.httpd_in("web", &format!("{ws}:80"));
    (srv, ws)
}

/// `docknet capture web --json` with `extra` arguments into `file`, once it runs (`top` counts
/// it).
fn start_capture(lab: &Lab, extra: &[&str], file: &std::path::Path) -> std::process::Child {
    let cap = lab
        .cmd()
        .args(["capture", "web", "--json"])
        .args(extra)
        .arg("-w")
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_captures(lab, 1, Duration::from_secs(10), "the capture did not start");
    cap
}

/// Waits until `docknet top` counts `n` captures running.
fn wait_captures(lab: &Lab, n: u64, within: Duration, what: &str) {
    let t = Instant::now();
    while lab.json(&["top", "--once", "--json", "--interval", "0.1"])["captures"] != n {
        assert!(t.elapsed() < within, "{what}");
    }
}

fn load(lab: &Lab, server: &str, requests: u64) -> serde_json::Value {
    let url = format!("http://{server}/bytes/100");
    let n = requests.to_string();
    lab.load_in("cli", &["--requests", &n, "-c", "1", &url])
}

#[test]
fn metrics_parse_and_move_with_traffic() {
    if !root_or_skip("metrics") {
        return;
    }
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // every frame through the daemon: no channel of the daemon's own between the pipes
    let mut lab = Lab::start_with(
        "adaptive",
        &["--metrics", &addr, "--fast-channels", "manual"],
    );
    let (_srv, ws) = web(&mut lab, 71);
    let before = scrape(port);
    let web_rx = sample(&before, "docknet_pipe_rx_packets_total", &[("pipe", "web")]);
    let r = load(&lab, &ws, 500);
    assert_eq!(r["ok"], 500, "{r}");
    let after = scrape(port);
    // every request went in and every answer came out through the daemon
    for (name, pipe) in [
        ("docknet_pipe_rx_packets_total", "web"),
        ("docknet_pipe_tx_packets_total", "web"),
        ("docknet_pipe_rx_packets_total", "cli"),
        ("docknet_pipe_tx_packets_total", "cli"),
    ] {
        let d = sample(&after, name, &[("pipe", pipe)]) - sample(&before, name, &[("pipe", pipe)]);
        assert!(d >= 500.0, "{name}{{pipe={pipe}}} moved by {d}");
    }
    assert!(sample(&after, "docknet_pipe_rx_bytes_total", &[("pipe", "web")]) > 500.0 * 60.0);
    assert!(web_rx < sample(&after, "docknet_pipe_rx_packets_total", &[("pipe", "web")]));
    // the counters are the ones `pipe show` reports
    let shown = lab.counter("web", "tx_packets") as f64;
    assert!(sample(&after, "docknet_pipe_tx_packets_total", &[("pipe", "web")]) <= shown);
    assert_eq!(
        sample(
            &after,
            "docknet_pipe_drops_total",
            &[("pipe", "web"), ("reason", "spoofed")]
        ),
        0.0
    );
    assert_eq!(sample(&after, "docknet_pipes", &[]), 2.0);
    assert_eq!(sample(&after, "docknet_auto_channels", &[]), 0.0, "off");
    let made = [("event", "made")];
    assert_eq!(
        sample(&after, "docknet_auto_channel_events_total", &made),
        0.0
    );
    let busy = sample(
        &after,
        "docknet_master_busy_seconds_total",
        &[("master", "0")],
    );
    let frames = sample(&after, "docknet_master_frames_total", &[("master", "0")]);
    // each request and each answer crosses the master once (their ACKs ride on the next
    // message of the other side)
    assert!(
        busy > 0.0 && frames >= 1000.0,
        "busy {busy} s, {frames} frames"
    );
    assert!(
        sample(
            &after,
            "docknet_control_requests_total",
            &[("op", "pipe_create")]
        ) == 2.0,
        "two pipes were created"
    );
    let version = env!("CARGO_PKG_VERSION");
    assert!(after
        .keys()
        .any(|(n, l)| n == "docknet_build_info"
            && l.iter().any(|(k, v)| k == "version" && v == version)));
    // a refused request is counted by its code
    assert!(!lab.run(&["pipe", "show", "nosuch"]).status.success());
    let again = scrape(port);
    assert!(
        sample(
            &again,
            "docknet_control_errors_total",
            &[("code", "not_found")]
        ) >= 1.0
    );
    // anything but the metrics is not found; only GET is served
    assert!(get(port, "/").0.contains("404"));
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 405"), "{out}");
    // garbage and a connection that says nothing do not stop the server
    let mut g = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    g.write_all(&[0xff; 9000]).unwrap();
    let _silent = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(get(port, "/metrics").0.contains("200"));

    // top, for scripts: both pipes and the master, as JSON
    let t = lab.json(&["top", "--once", "--json", "--interval", "0.2"]);
    let names: Vec<&str> = t["pipes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pipe"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{t}");
    assert!(names.contains(&"web") && names.contains(&"cli"));
    assert_eq!(t["masters"].as_array().unwrap().len(), 1, "{t}");
}

#[test]
fn a_capture_of_a_known_exchange_reads_back_in_tcpdump() {
    if !root_or_skip("capture") {
        return;
    }
    if Command::new("tcpdump").arg("--version").output().is_err() {
        panic!("tcpdump is needed (scripts/setup.sh installs it)");
    }
    let mut lab = Lab::start("adaptive");
    let (_srv, ws) = web(&mut lab, 72);
    let file = lab.dir.join("web.pcap");
    let mut cap = start_capture(&lab, &["--count", "100"], &file);
    let r = load(&lab, &ws, 200);
    assert_eq!(r["ok"], 200, "{r}");
    let t = Instant::now();
    let status = loop {
        if let Some(s) = cap.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the capture did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    cap.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut err = String::new();
    cap.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "{err}");
    let summary: serde_json::Value = serde_json::from_str(&out).expect("a JSON summary");
    assert_eq!(summary["captured"], 100, "{summary}");
    assert_eq!(summary["ended"], "count", "{summary}");
    assert_eq!(summary["dropped_from_capture"], 0, "{summary}");
    let sent = summary["sent"].as_u64().unwrap();
    let received = summary["received"].as_u64().unwrap();
    assert!(
        sent > 0 && received > 0 && sent + received == 100,
        "{summary}"
    );

    let o = Command::new("tcpdump")
        .args(["-nn", "-r"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.lines().count(), 100, "{text}");
    let cli = ws.replace(".2", ".3");
    // the exchange as it happened: the client's SYN to port 80, the server's SYN-ACK, requests
    assert!(
        text.contains(&format!("{cli}.")) && text.contains(&format!("> {ws}.80: Flags [S]")),
        "{text}"
    );
    assert!(
        text.contains(&format!("IP {ws}.80 > {cli}.")) && text.contains("Flags [S.]"),
        "{text}"
    );
    let a = Command::new("tcpdump")
        .args(["-nn", "-A", "-r"])
        .arg(&file)
        .output()
        .unwrap();
    let ascii = String::from_utf8_lossy(&a.stdout);
    assert!(
        ascii.contains("GET /bytes/100 HTTP/1.1"),
        "the requests are in the capture"
    );
    assert!(ascii.contains("HTTP/1.1 200"), "and the answers");
    // nanosecond timestamps in order
    let ts = Command::new("tcpdump")
        .args(["-nn", "--time-stamp-precision=nano", "-tt", "-r"])
        .arg(&file)
        .output()
        .unwrap();
    let stamps: Vec<f64> = String::from_utf8_lossy(&ts.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(stamps.len(), 100);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        stamps.windows(2).all(|w| w[0] <= w[1] + 1e-3),
        "timestamps in order"
    );
    assert!(
        (now - stamps[0]).abs() < 120.0,
        "timestamps are the time of day"
    );
}

#[test]
fn ctrl_c_ends_a_capture_with_the_daemons_summary() {
    if !root_or_skip("capture ctrl-c") {
        return;
    }
    let mut lab = Lab::start("adaptive");
    let (_srv, ws) = web(&mut lab, 74);
    let file = lab.dir.join("web.pcap");
    let cap = start_capture(&lab, &[], &file);
    let r = load(&lab, &ws, 2000);
    assert_eq!(r["ok"], 2000, "{r}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(cap.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = cap.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON summary");
    // the daemon answered the stop with its summary: how many frames it left out is known
    assert_eq!(summary["ended"], "stopped", "{summary}");
    assert!(summary["dropped_from_capture"].is_u64(), "{summary}");
    let captured = summary["captured"].as_u64().unwrap();
    assert_eq!(
        captured,
        summary["sent"].as_u64().unwrap() + summary["received"].as_u64().unwrap()
    );
    // 2000 requests and answers at least, each frame in the file or counted as left out
    let dropped = summary["dropped_from_capture"].as_u64().unwrap();
    assert!(captured > 0 && captured + dropped >= 4000, "{summary}");
    let o = Command::new("tcpdump")
        .args(["-nn", "-r"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).lines().count() as u64,
        captured
    );
    wait_captures(&lab, 0, Duration::from_secs(10), "the capture did not end");
}

#[test]
fn a_stalled_capture_reader_costs_the_pipe_nothing() {
    if !root_or_skip("stalled capture") {
        return;
    }
    let mut lab = Lab::start("adaptive");
    let (_srv, ws) = web(&mut lab, 73);
    // a client that asks for a capture and never reads it
    let mut s = std::os::unix::net::UnixStream::connect(&lab.socket).unwrap();
    s.write_all(b"{\"v\":1,\"op\":\"capture\",\"name\":\"web\",\"snaplen\":64}\n")
        .unwrap();
    wait_captures(
        &lab,
        1,
        Duration::from_secs(10),
        "the capture did not start",
    );
    // a second capture of the same pipe is refused while it runs
    let o = lab.run(&["capture", "web", "-w", "/dev/null"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("being captured"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // and a capture of a pipe that carries nothing of this traffic gets none of it
    lab.ok(&["pipe", "create", "bystander", "--ip", "10.73.0.9/24"]);
    let mut other = std::os::unix::net::UnixStream::connect(&lab.socket).unwrap();
    other
        .write_all(b"{\"v\":1,\"op\":\"capture\",\"name\":\"bystander\"}\n")
        .unwrap();
    wait_captures(
        &lab,
        2,
        Duration::from_secs(10),
        "the second capture did not start",
    );
    let r = load(&lab, &ws, 3000);
    assert_eq!(r["ok"], 3000, "{r}");
    other
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = other.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let reply_end = got
        .iter()
        .position(|&b| b == b'\n')
        .expect("the capture's reply");
    assert!(
        String::from_utf8_lossy(&got[..reply_end]).contains("\"ok\":true"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(
        got.len(),
        reply_end + 1,
        "no records for a pipe without traffic"
    );
    drop(other);
    assert_eq!(lab.counter("web", "drop_rx_full"), 0);
    assert_eq!(lab.counter("cli", "drop_rx_full"), 0);
    // the reader goes away: the capture ends and the tap is removed
    drop(s);
    wait_captures(&lab, 0, Duration::from_secs(15), "the capture did not end");
    // a bad snap length and an unknown pipe are refused with a reason
    let o = lab.run(&["capture", "nosuch", "-w", "/dev/null"]);
    assert!(!o.status.success());
    let mut s = std::os::unix::net::UnixStream::connect(&lab.socket).unwrap();
    s.write_all(b"{\"v\":1,\"op\":\"capture\",\"name\":\"web\",\"snaplen\":1}\n")
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(&s), &mut line).unwrap();
    assert!(line.contains("bad_params"), "{line}");
}
