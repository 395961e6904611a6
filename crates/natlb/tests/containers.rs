//! The balancer in a real container, with a daemon, three backend containers on fast channels
//! (`named_echo`, which names itself on every connection) and a client container
//! (`natlb_client`) going through the daemon. Needs root.

mod lab;
use lab::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

const VIP: &str = "10.77.0.1";
const SECS: fn(u64) -> Duration = Duration::from_secs;

struct Cluster {
    // fields drop in order: processes first, then the lab (daemon, run directory)
    client: Proc,
    lb: Proc,
    backends: Vec<Option<Proc>>,
    names: Vec<String>,
    lab: Lab,
}

/// Daemon, pipes `lb`, `b1`..`b3` (fast channels to `lb`) and `c`; the backends and the
/// balancer started (with `lb_args`) and ready; the client started.
fn cluster(lb_args: &[&str]) -> Cluster {
    let lab = Lab::start();
    lab.ok(&["pipe", "create", "lb", "--ip", &format!("{VIP}/24")]);
    lab.ok(&["pipe", "create", "c", "--ip", "10.77.0.100/24"]);
    let echo = beside("examples/named_echo");
    let mut backends = Vec::new();
    let mut names = Vec::new();
    for i in 1..=3 {
        let pipe = format!("b{i}");
        lab.ok(&["pipe", "create", &pipe, "--ip", &format!("10.77.0.1{i}/24")]);
        lab.ok(&["fc", "connect", "lb", &pipe]);
        let name = format!("{}-b{i}", lab.tag);
        let mut p = lab.spawn(&pipe, None, &[&echo, &name, "7"], false);
        p.wait_err("named_echo", SECS(20));
        backends.push(Some(p));
        names.push(name);
    }
    let mut args = vec![
        NATLB,
        "--backend",
        "10.77.0.11:7",
        "--backend",
        "10.77.0.12:7",
        "--backend",
        "10.77.0.13:7",
        "--port",
        "7",
        "--idle",
        "adaptive",
        "--probe-interval-ms",
        "200",
        "--probe-timeout-ms",
        "500",
        "--fail-after",
        "2",
    ];
    args.extend_from_slice(lb_args);
    let mut lb = lab.spawn("lb", None, &args, false);
    lb.wait_err("serving", SECS(20));
    let client = lab.spawn(
        "c",
        None,
        &[&beside("examples/natlb_client"), &format!("{VIP}:7")],
        true,
    );
    Cluster {
        client,
        lb,
        backends,
        names,
        lab,
    }
}

impl Cluster {
    fn ask(&mut self, cmd: &str) -> Value {
        self.client.ask(cmd, SECS(120))
    }

    /// Opens `n` connections; the backend name of each (all must open).
    fn open(&mut self, n: usize) -> Vec<String> {
        let v = self.ask(&format!("open {n}"));
        let names: Vec<String> = v["opened"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                x.as_str()
                    .unwrap_or_else(|| panic!("a connection failed: {v}"))
                    .to_string()
            })
            .collect();
        assert_eq!(names.len(), n);
        names
    }

    /// Echoes `bytes` on every connection: (backend, ok) per connection.
    fn echo(&mut self, bytes: usize) -> Vec<(String, bool)> {
        let v = self.ask(&format!("echo {bytes}"));
        v["echo"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["backend"].as_str().unwrap().to_string(),
                    r["ok"].as_bool().unwrap(),
                )
            })
            .collect()
    }

    /// Kills backend `i`'s container and waits until none of its processes is left: the
    /// supervisor dies at once, the container's processes a moment later (their parent's death
    /// signal), and until then they still answer.
    fn kill_backend(&mut self, i: usize) {
        self.backends[i].take().unwrap().kill();
        let name = self.names[i].clone();
        let end = std::time::Instant::now() + SECS(20);
        while !processes_with(&name).is_empty() {
            assert!(
                std::time::Instant::now() < end,
                "{name} outlived its supervisor"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// Ends everything: the client, the balancer (SIGTERM: it must exit 0 and print its
    /// counters), the backends, the pipes, the daemon; checks nothing is left. Returns the
    /// balancer's counters.
    fn finish(mut self) -> Value {
        let w = self.client.stdin.as_mut().unwrap();
        let _ = std::io::Write::write_all(w, b"quit\n");
        assert!(self.client.wait(SECS(20)).success());
        let st = self.lb.term(SECS(20));
        let mut out = Vec::new();
        while let Ok(l) = self.lb.out.recv_timeout(SECS(5)) {
            out.push(l);
        }
        assert!(st.success(), "balancer: {st:?} {}", self.lb.stderr());
        let stats: Value =
            serde_json::from_str(out.last().expect("the balancer printed its counters"))
                .expect("counters are JSON");
        eprintln!("balancer counters: {stats}");
        for b in self.backends.iter_mut().flatten() {
            b.kill();
        }
        self.lab.remove_pipes(&["lb", "c", "b1", "b2", "b3"]);
        let tag = self.lab.tag.clone();
        let dir = self.lab.dir.clone();
        drop(self);
        assert!(!dir.exists(), "run directory left behind");
        assert_eq!(
            processes_with(&tag),
            Vec::<u32>::new(),
            "processes left behind"
        );
        stats
    }
}

fn count(names: &[String]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for n in names {
        *m.entry(n.clone()).or_default() += 1;
    }
    m
}

fn backend<'a>(stats: &'a Value, addr: &str) -> &'a Value {
    stats["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["addr"] == addr)
        .unwrap_or_else(|| panic!("no backend {addr} in {stats}"))
}

#[test]
fn round_robin_spreads_connections_pins_them_and_carries_streams_intact() {
    if !root_or_skip("round_robin") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = cluster(&["--policy", "rr"]);
    let names = c.open(30);
    let per = count(&names);
    assert_eq!(per.len(), 3, "{per:?}");
    assert!(per.values().all(|&n| n == 10), "round robin: {per:?}");
    // each connection keeps talking to the backend that greeted it: 100 kB each way on every
    // one (3 MB through the balancer), every byte checked by the client
    let r = c.echo(100_000);
    assert_eq!(r.len(), 30);
    assert!(r.iter().all(|(_, ok)| *ok), "{r:?}");
    // and a longer stream on one connection at a time, interleaved by the client
    let r = c.echo(1_000_000);
    assert!(r.iter().all(|(_, ok)| *ok), "{r:?}");
    let b2 = c.name(1).to_string();
    assert_eq!(c.ask(&format!("close {b2}"))["closed"], 10);
    let stats = c.finish();
    for a in ["10.77.0.11:7", "10.77.0.12:7", "10.77.0.13:7"] {
        let b = backend(&stats, a);
        assert_eq!(b["total"], 10, "{b}");
        assert_eq!(b["state"], "up", "{b}");
        assert_eq!(b["taken_out"], 0, "{b}");
    }
    assert_eq!(stats["counters"]["conns_total"], 30);
    assert_eq!(stats["drops"]["malformed"], 0);
    assert_eq!(stats["drops"]["wrong_backend"], 0);
    assert!(stats["counters"]["to_backends"].as_u64().unwrap() > 30 * 10);
}

#[test]
fn least_connections_sends_new_connections_to_the_emptiest_backend() {
    if !root_or_skip("least_conn") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = cluster(&["--policy", "least-conn"]);
    let per = count(&c.open(6));
    assert!(per.values().all(|&n| n == 2), "{per:?}");
    let b2 = c.name(1).to_string();
    assert_eq!(c.ask(&format!("close {b2}"))["closed"], 2);
    // both ends sent FIN: b2 has no connection left, the others two each
    let next = c.open(2);
    assert_eq!(next, [b2.clone(), b2.clone()], "least-conn fills b2 first");
    let r = c.echo(10_000);
    assert!(r.iter().all(|(_, ok)| *ok), "{r:?}");
    let stats = c.finish();
    assert_eq!(backend(&stats, "10.77.0.12:7")["total"], 4);
    assert_eq!(stats["policy"], "least-conn");
}

#[test]
fn a_killed_backend_is_taken_out_while_the_others_carry_on() {
    if !root_or_skip("killed_backend") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = cluster(&["--policy", "rr"]);
    let per = count(&c.open(9));
    assert!(per.values().all(|&n| n == 3), "{per:?}");
    assert!(c.echo(10_000).iter().all(|(_, ok)| *ok));
    // kill b2's container (its supervisor: the container dies with it)
    let b2 = c.name(1).to_string();
    c.kill_backend(1);
    // its connections are reset once the probes fail; the others' go on
    let r = c.echo(10_000);
    for (name, ok) in &r {
        assert_eq!(*ok, *name != b2, "{name}: {r:?}");
    }
    // new connections go to the two that are left
    let per = count(&c.open(6));
    assert_eq!(per.get(&b2), None, "{per:?}");
    assert_eq!(per.values().sum::<usize>(), 6);
    let r = c.echo(10_000);
    assert_eq!(r.len(), 12);
    assert!(r.iter().all(|(_, ok)| *ok), "{r:?}");
    let stats = c.finish();
    let b = backend(&stats, "10.77.0.12:7");
    assert_eq!(b["state"], "down", "{b}");
    assert_eq!(b["conns_reset"], 3, "{b}");
    assert!(b["probe_failures"].as_u64().unwrap() >= 2, "{b}");
    assert_eq!(b["active"], 0, "{b}");
    for a in ["10.77.0.11:7", "10.77.0.13:7"] {
        assert_eq!(backend(&stats, a)["state"], "up");
        assert_eq!(backend(&stats, a)["conns_reset"], 0);
    }
}

#[test]
fn a_removed_fast_channel_takes_a_backend_out_until_it_is_back() {
    if !root_or_skip("removed_channel") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = cluster(&["--policy", "rr"]);
    assert_eq!(count(&c.open(9)).len(), 3);
    let b3 = c.name(2).to_string();
    c.lab.ok(&["fc", "rm", "lb", "b3"]);
    let r = c.echo(10_000);
    for (name, ok) in &r {
        assert_eq!(*ok, *name != b3, "{name}: {r:?}");
    }
    let per = count(&c.open(4));
    assert_eq!(per.get(&b3), None, "{per:?}");
    // the channel again: probed, back in the rotation
    c.lab.ok(&["fc", "connect", "lb", "b3"]);
    std::thread::sleep(Duration::from_millis(1500));
    let per = count(&c.open(6));
    assert_eq!(per.get(&b3), Some(&2), "{per:?}");
    assert!(c.echo(10_000).iter().all(|(_, ok)| *ok));
    let stats = c.finish();
    let b = backend(&stats, "10.77.0.13:7");
    assert_eq!(b["state"], "up", "{b}");
    assert_eq!(b["taken_out"], 1, "{b}");
    assert_eq!(b["conns_reset"], 3, "{b}");
}

#[test]
fn a_backend_without_a_fast_channel_is_refused_in_one_line() {
    if !root_or_skip("not_a_partner") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::start();
    lab.ok(&["pipe", "create", "lb", "--ip", "10.77.0.1/24"]);
    lab.ok(&["pipe", "create", "b1", "--ip", "10.77.0.11/24"]);
    let (st, _, err) = lab.run("lb", &[NATLB, "--backend", "10.77.0.11:80", "--port", "80"]);
    assert_eq!(st.code(), Some(1));
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("10.77.0.11:80 is not a fast-channel partner of pipe lb"),
        "{err}"
    );
    let (st, _, err) = lab.run("lb", &[NATLB, "--backend", "10.77.0.11", "--port", "0"]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("a port is 1 to 65535"), "{err}");
    lab.remove_pipes(&["lb", "b1"]);
}

#[test]
fn it_waits_as_every_docknet_program_does_unless_told() {
    // the same idle default everywhere: yielding, which measured best where cores are shared
    let o = std::process::Command::new(NATLB)
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    let idle = help
        .split("--idle <IDLE>")
        .nth(1)
        .and_then(|s| s.split("\n      --").next())
        .unwrap_or_default();
    assert!(idle.contains("[default: adaptive]"), "{help}");
}
