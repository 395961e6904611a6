//! Unmodified programs over DockNet with `docknet run --preload`: a C program's every socket
//! call against the same program on kernel sockets, curl against nginx, redis-benchmark
//! against redis-server, iperf3 and sockperf; through the daemon and over fast channels.
//! Needs root; a test whose Debian tool is missing is skipped with the package to install.

mod common;

use common::{one_at_a_time, preload_library as library, root_or_skip, Lab, EXE};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Whether test `test` can run here (root, and `tools` installed: otherwise it says what is
/// missing); the preload library is then in place beside the docknet binary.
fn ready(test: &str, tools: &[(&str, &str)]) -> bool {
    if !root_or_skip(test) || !tools_or_skip(test, tools) {
        return false;
    }
    library();
    true
}

/// Whether the programs are installed; otherwise says which package to install.
fn tools_or_skip(test: &str, tools: &[(&str, &str)]) -> bool {
    for (bin, pkg) in tools {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
            .unwrap_or(false);
        if !found {
            eprintln!("skipping {test}: {bin} is not installed (apt-get install {pkg})");
            return false;
        }
    }
    true
}

/// A daemon with a server pipe and a client pipe (a fast channel between them if `fc`).
fn lab(fc: bool) -> (Lab, String, String, String) {
    let lab = Lab::start("adaptive");
    let n = std::process::id() % 200 + 20;
    let k = SEQ.fetch_add(1, Ordering::Relaxed);
    let (s, c) = (format!("pls{n}x{k}"), format!("plc{n}x{k}"));
    let net = format!("10.{}.{}", 60 + k % 30, n);
    lab.ok(&["pipe", "create", &s, "--ip", &format!("{net}.2/24")]);
    lab.ok(&["pipe", "create", &c, "--ip", &format!("{net}.3/24")]);
    if fc {
        lab.ok(&["fc", "connect", &s, &c]);
    }
    (lab, s, c, format!("{net}.2"))
}

fn run_args(
    lab: &Lab,
    pipe: &str,
    binds: &[&Path],
    env: &[(&str, &str)],
    args: &[&str],
) -> Command {
    let mut c = lab.cmd();
    c.args(["run", "--pipe", pipe, "--preload"]);
    for b in binds {
        c.arg("--bind").arg(b);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.arg("--").args(args);
    c
}

/// A server container, killed (with its container) when dropped.
struct Server(Option<Child>);

impl Server {
    fn start(lab: &Lab, pipe: &str, binds: &[&Path], args: &[&str]) -> Server {
        Server::spawn(run_args(lab, pipe, binds, &[], args), Stdio::null())
    }

    /// A server container whose output is kept, for [`Server::finish`].
    fn start_captured(lab: &Lab, pipe: &str, args: &[&str]) -> Server {
        Server::spawn(run_args(lab, pipe, &[], &[], args), Stdio::piped())
    }

    fn spawn(mut c: Command, stdout: Stdio) -> Server {
        let c = c
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .expect("server container");
        Server(Some(c))
    }

    /// The next line of the server's output (read a byte at a time: the rest stays for
    /// [`Server::finish`]).
    fn line(&mut self) -> String {
        use std::io::Read;
        let out = self.0.as_mut().and_then(|c| c.stdout.as_mut());
        let out = out.expect("a server started with its output captured");
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while out.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
            line.push(b[0]);
        }
        String::from_utf8_lossy(&line).into_owned()
    }

    /// Waits for the server to end on its own (at most `limit`); its output.
    fn finish(mut self, limit: Duration) -> Output {
        let mut c = self.0.take().expect("a running server");
        let t = Instant::now();
        while c.try_wait().unwrap().is_none() {
            if t.elapsed() > limit {
                let _ = c.kill();
                let o = c.wait_with_output().unwrap();
                panic!(
                    "the server did not end in {limit:?}: stdout {} stderr {}",
                    text(&o),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        c.wait_with_output().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGKILL to `docknet run`: its init dies with it (parent-death signal), and with the
        // init the container's PID namespace
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs a client container to completion (at most `limit`).
fn client(
    lab: &Lab,
    pipe: &str,
    binds: &[&Path],
    env: &[(&str, &str)],
    args: &[&str],
    limit: Duration,
) -> Output {
    let mut child = run_args(lab, pipe, binds, env, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("client container");
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "{args:?} did not finish in {limit:?}: stdout {} stderr {}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn must(o: &Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what} failed: {}\nstdout {}\nstderr {}",
        o.status,
        text(o),
        String::from_utf8_lossy(&o.stderr)
    );
    text(o)
}

/// Runs `server` in a container and then the client `client_args(server address)` in another,
/// through the daemon and over a fast channel, and checks that both print what they printed
/// on kernel sockets (`kernel`: the client's output, then the server's) and that the library
/// wrote nothing on stderr. `binds`: directories both containers are shown.
fn same_outcomes_as_the_kernels(
    what: &str,
    binds: &[&Path],
    server: &[&str],
    client_args: &dyn Fn(&str) -> Vec<String>,
    kernel: (&str, &str),
) {
    for fc in [false, true] {
        let (lab, s, c, ip) = lab(fc);
        let srv = Server::spawn(run_args(&lab, &s, binds, &[], server), Stdio::piped());
        let args = client_args(&ip);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = client(&lab, &c, binds, &[], &args, Duration::from_secs(60));
        let dc = must(&o, "the client");
        let so = srv.finish(Duration::from_secs(30));
        let (ds, err) = (text(&so), String::from_utf8_lossy(&so.stderr).into_owned());
        assert_eq!(
            (dc.as_str(), ds.as_str()),
            kernel,
            "{what}, fast channel {fc}: outcomes differ from the kernel's; server stderr:\n{err}"
        );
        assert!(
            !err.contains("docknet-preload"),
            "{what}, fast channel {fc}: {err}"
        );
    }
}

/// Compiles the test program `tests/preload/NAME.c` into `dir`; the binary's path.
fn compile_c(dir: &tempfile::TempDir, name: &str) -> std::path::PathBuf {
    let bin = dir.path().join(name);
    let src = format!("{}/tests/preload/{name}.c", env!("CARGO_MANIFEST_DIR"));
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg("-lpthread")
        .output()
        .unwrap();
    must(&cc, &format!("cc {name}.c"));
    bin
}

/// A directory for the test's files, shown read-only in the containers and readable by their
/// users (each container's own), as a program's directory must be.
/// How many of prefork.c's workers answered any connection ("busy workers: B"; 0 if not said).
fn busy_workers(out: &str) -> u32 {
    out.lines()
        .find_map(|l| l.strip_prefix("busy workers: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

fn workdir(name: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new()
        .prefix(&format!("dnpl-{name}-{}-", std::process::id()))
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Runs the C program's client in a fresh network namespace against its server on
/// loopback: the kernel's answers.
fn kernel_run(bin: &Path) -> String {
    let b = bin.to_str().unwrap();
    kernel_pair(
        &[b, "server", "127.0.0.1", "7300"],
        &[b, "client", "127.0.0.1", "7300"],
        false,
    )
    .1
}

/// Runs `server` and then `client` in a fresh network namespace (loopback only): the client's
/// output, and with `wait_server` the server's (the server must then end by itself; else it is
/// killed after the client).
fn kernel_pair(server: &[&str], client: &[&str], wait_server: bool) -> (String, String) {
    let ns = format!(
        "dnpl{}x{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let ok = |args: &[&str]| {
        assert!(
            Command::new("ip").args(args).status().unwrap().success(),
            "ip {args:?}"
        )
    };
    ok(&["netns", "add", &ns]);
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _del = Del(ns.clone());
    ok(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]);
    let mut srv = Command::new("timeout")
        .args(["60", "ip", "netns", "exec", &ns])
        .args(server)
        .stdout(if wait_server {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let o = Command::new("timeout")
        .args(["60", "ip", "netns", "exec", &ns])
        .args(client)
        .output()
        .unwrap();
    let server_out = if wait_server {
        let so = srv.wait_with_output().unwrap();
        must(&so, "the server on kernel sockets")
    } else {
        let _ = srv.kill();
        let _ = srv.wait();
        String::new()
    };
    (server_out, must(&o, "the C program on kernel sockets"))
}

#[test]
fn a_c_program_sees_the_same_outcomes_over_docknet_as_on_kernel_sockets() {
    if !ready("preload C program", &[("cc", "gcc")]) {
        return;
    }
    // it checks how long waits take: it runs apart from the tests that load the cores
    let _one = one_at_a_time();
    let dir = workdir("check");
    let bin = compile_c(&dir, "check");
    let kernel = kernel_run(&bin);
    assert!(kernel.lines().count() > 80, "kernel run: {kernel}");
    let b = bin.to_str().unwrap();
    for fc in [false, true] {
        let (lab, s, c, ip) = lab(fc);
        let _srv = Server::start(&lab, &s, &[], &[b, "server", "0.0.0.0", "7300"]);
        let o = client(
            &lab,
            &c,
            &[],
            &[],
            &[b, "client", &ip, "7300"],
            Duration::from_secs(60),
        );
        let dn = must(&o, "the C program over DockNet");
        let diff: Vec<String> = kernel
            .lines()
            .zip(dn.lines())
            .filter(|(k, d)| k != d)
            .map(|(k, d)| format!("kernel {k:?} docknet {d:?}"))
            .collect();
        assert!(
            diff.is_empty() && kernel.lines().count() == dn.lines().count(),
            "fast channel {fc}: outcomes differ:\n{}\nkernel:\n{kernel}\ndocknet:\n{dn}",
            diff.join("\n")
        );
        if !fc {
            // DOCKNET_PRELOAD=off: the kernel's sockets, and the container has only lo (the
            // first case tells; the rest would wait for a server it cannot reach)
            let o = client(
                &lab,
                &c,
                &[dir.path()],
                &[("DOCKNET_PRELOAD", "off")],
                &["timeout", "3", b, "client", &ip, "7301"],
                Duration::from_secs(30),
            );
            let first = text(&o).lines().next().unwrap_or("").to_string();
            assert_eq!(first, "refused.connect: -1 ENETUNREACH", "{}", text(&o));
        }
    }
}

#[test]
fn a_port_bound_before_connect_is_the_connections() {
    if !ready("bind_connect", &[("python3", "python3")]) {
        return;
    }
    let (lab, srv, c, ip) = lab(false);
    let dir = tempfile::tempdir().unwrap();
    let server = dir.path().join("server.py");
    std::fs::write(
        &server,
        "import socket\n\
         s = socket.socket()\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('0.0.0.0', 7400))\n\
         s.listen(8)\n\
         while True:\n\
         \x20   c, a = s.accept()\n\
         \x20   c.sendall(str(a[1]).encode())\n\
         \x20   c.close()\n",
    )
    .unwrap();
    let client_py = dir.path().join("client.py");
    std::fs::write(
        &client_py,
        "import json, socket, sys\n\
         out = []\n\
         for port in (45678, 0):\n\
         \x20   s = socket.socket()\n\
         \x20   s.bind(('0.0.0.0', port))\n\
         \x20   bound = s.getsockname()[1]\n\
         \x20   s.connect((sys.argv[1], 7400))\n\
         \x20   local = s.getsockname()[1]\n\
         \x20   seen = int(s.recv(16))\n\
         \x20   out.append([bound, local, seen])\n\
         \x20   s.close()\n\
         print(json.dumps(out))\n",
    )
    .unwrap();
    let _server = Server::start(
        &lab,
        &srv,
        &[dir.path()],
        &["/usr/bin/python3", server.to_str().unwrap()],
    );
    let script = format!(
        "for i in 1 2 3 4 5 6 7 8 9 10; do /usr/bin/python3 {} {ip} && exit 0; sleep 0.3; done; exit 1",
        client_py.display()
    );
    let o = client(
        &lab,
        &c,
        &[dir.path()],
        &[],
        &["sh", "-c", &script],
        Duration::from_secs(60),
    );
    let out = must(&o, "the client");
    let v: Vec<[u16; 3]> = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    // the port asked for, and one the stack chose at bind: each the connection's, as the
    // server sees it
    assert_eq!(v[0], [45678, 45678, 45678], "{out}");
    assert!(
        v[1][0] != 0 && v[1][0] == v[1][1] && v[1][1] == v[1][2],
        "{out}"
    );
}

#[test]
fn passing_a_docknet_socket_to_another_process_is_refused_with_one_line() {
    if !ready("scm_rights", &[("python3", "python3")]) {
        return;
    }
    let (lab, _s, c, _ip) = lab(false);
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("pass.py");
    std::fs::write(
        &prog,
        "import json, os, socket\n\
         u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         u.bind(('0.0.0.0', 9999))\n\
         a, b = socket.socketpair()\n\
         out = {}\n\
         try:\n\
         \x20   socket.send_fds(a, [b'x'], [u.fileno()])\n\
         \x20   out['docknet'] = 'passed'\n\
         except OSError as e:\n\
         \x20   out['docknet'] = e.errno\n\
         f = os.open('/dev/null', os.O_RDONLY)\n\
         socket.send_fds(a, [b'y'], [f])\n\
         msg, fds, _, _ = socket.recv_fds(b, 10, 4)\n\
         out['file'] = [msg.decode(), len(fds)]\n\
         print(json.dumps(out))\n",
    )
    .unwrap();
    let o = client(
        &lab,
        &c,
        &[dir.path()],
        &[],
        &["/usr/bin/python3", prog.to_str().unwrap()],
        Duration::from_secs(60),
    );
    let out = must(&o, "the program");
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(v["docknet"], libc::EOPNOTSUPP, "{out}");
    assert_eq!(
        v["file"],
        serde_json::json!(["y", 1]),
        "other descriptors pass: {out}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("SCM_RIGHTS").count(), 1, "one line: {err}");
}

/// A connection passed to another process over a Unix socket (`SCM_RIGHTS`), as a supervisor
/// hands accepted connections to a worker it started before: the worker reads the request and
/// answers on it, the supervisor having closed its copy, and the client reads the answer and
/// the end of stream. The outcome is the kernel's, through the daemon and over a fast channel.
#[test]
fn a_connection_passed_to_another_process_is_served_there_as_on_kernel_sockets() {
    if !ready("scm_rights connection", &[("python3", "python3")]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let server = dir.path().join("pass_server.py");
    std::fs::write(
        &server,
        "import os, socket, sys\n\
         l = socket.socket()\n\
         l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         l.bind(('0.0.0.0', int(sys.argv[1])))\n\
         l.listen()\n\
         a, b = socket.socketpair()\n\
         pid = os.fork()\n\
         if pid == 0:\n\
         \x20   l.close(); a.close()\n\
         \x20   for i in range(3):\n\
         \x20       _, fds, _, _ = socket.recv_fds(b, 10, 1)\n\
         \x20       c = socket.socket(fileno=fds[0])\n\
         \x20       got = b''\n\
         \x20       while not got.endswith(b'\\n'):\n\
         \x20           got += c.recv(100)\n\
         \x20       c.sendall(b'worker got ' + got)\n\
         \x20       c.close()\n\
         \x20   os._exit(0)\n\
         b.close()\n\
         for i in range(3):\n\
         \x20   c, _ = l.accept()\n\
         \x20   socket.send_fds(a, [b'c'], [c.fileno()])\n\
         \x20   c.close()\n\
         os.waitpid(pid, 0)\n\
         print('supervisor: passed 3')\n",
    )
    .unwrap();
    let client_py = dir.path().join("pass_client.py");
    std::fs::write(
        &client_py,
        "import socket, sys, time\n\
         for i in range(3):\n\
         \x20   for t in range(50):\n\
         \x20       try:\n\
         \x20           s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n\
         \x20           break\n\
         \x20       except OSError:\n\
         \x20           time.sleep(0.1)\n\
         \x20   s.sendall(b'hello %d\\n' % i)\n\
         \x20   got = b''\n\
         \x20   while True:\n\
         \x20       d = s.recv(100)\n\
         \x20       if not d: break\n\
         \x20       got += d\n\
         \x20   print(got.decode().strip())\n",
    )
    .unwrap();
    let (sp, cp) = (server.to_str().unwrap(), client_py.to_str().unwrap());
    let (ks, kc) = kernel_pair(
        &["python3", sp, "7460"],
        &["python3", cp, "127.0.0.1", "7460"],
        true,
    );
    assert_eq!(
        kc.lines().collect::<Vec<_>>(),
        [
            "worker got hello 0",
            "worker got hello 1",
            "worker got hello 2"
        ],
        "kernel: {kc}"
    );
    same_outcomes_as_the_kernels(
        "a passed connection",
        &[dir.path()],
        &["/usr/bin/python3", sp, "7460"],
        &|ip| {
            vec![
                "/usr/bin/python3".into(),
                cp.into(),
                ip.into(),
                "7460".into(),
            ]
        },
        (&kc, &ks),
    );
}

/// A forked child cannot take the pipe's stack while its parent uses it: the parent looks at
/// its listener after the fork, before the child tries it. The child's listener is then one no
/// connection reaches (never ready; `epoll_ctl` takes it, as watching nothing), as a worker's
/// whose sibling serves. Its copy of a connection works as on kernel sockets (the parent
/// serves it for the child: nothing to read yet, `poll` and `epoll` take it), and the parent's
/// connection carries on undisturbed after the child closed its copy.
#[test]
fn a_child_is_refused_the_stack_its_parent_uses_and_the_parent_carries_on() {
    if !ready("preload fork", &[("cc", "gcc")]) {
        return;
    }
    let dir = workdir("forked");
    let bin = compile_c(&dir, "forked");
    let b = bin.to_str().unwrap();
    for fc in [false, true] {
        let (lab, s, c, ip) = lab(fc);
        let server = Server::start_captured(&lab, &s, &[b, "server", "7400"]);
        let o = client(
            &lab,
            &c,
            &[],
            &[],
            &[b, "client", &ip, "7400"],
            Duration::from_secs(60),
        );
        let out = must(&o, "the client");
        assert!(
            out.contains("client.ready: 1 R"),
            "fast channel {fc}: {out}"
        );
        assert!(
            out.contains("client.echo: 4 ping"),
            "fast channel {fc}: {out}"
        );
        let so = server.finish(Duration::from_secs(30));
        let got = text(&so);
        let err = String::from_utf8_lossy(&so.stderr).into_owned();
        for want in [
            "parent.first: 0",
            "listener.accept: -1 EAGAIN",
            "listener.poll: 0 nval 0",
            "listener.epoll_ctl: 0",
            "listener.close: 0",
            "parent.accept: 1",
            "conn.recv: -1 EAGAIN",
            "conn.poll: 0 nval 0",
            "conn.epoll_ctl: 0",
            "conn.close: 0",
            "parent.recv: 4",
            "parent.send: 4",
        ] {
            assert!(
                got.lines().any(|l| l == want),
                "fast channel {fc}: no {want:?} in\n{got}\nstderr:\n{err}"
            );
        }
        assert!(
            !err.contains("docknet-preload"),
            "fast channel {fc}: nothing failed, nothing to say: {err}"
        );
    }
}

/// A server that accepts and forks a process per connection (PostgreSQL's postmaster): the
/// parent closes its copy at once and accepts the next; each child reads its request with
/// epoll, answers what it sees of the connection (its addresses, TCP_NODELAY, SO_TYPE), naps
/// while the client sends it 1 MiB (more than the sockets between hold: the relay holds the
/// rest back), reads it, sends 256 KiB, shuts down and waits for the client's close. Eight
/// connections open at once give eight children served together. And inetd's way: the child puts the connection on its
/// standard input and output and `exec`s a shell that reads a line and answers it. And a
/// server that answers and exits without closing the connection (the answer and the end of
/// stream still reach the client, as the kernel sends them for an exiting process). The
/// outcomes are the kernel's, through the daemon and over a fast channel, and the library
/// writes nothing on stderr.
#[test]
fn a_connection_handed_to_a_forked_child_is_served_by_it_as_on_kernel_sockets() {
    if !ready("preload handoff", &[("cc", "gcc")]) {
        return;
    }
    let dir = workdir("handoff");
    let bin = compile_c(&dir, "forked");
    let b = bin.to_str().unwrap();
    let runs: [(&[&str], &[&str], &str); 3] = [
        (
            &["handoff", "7450", "8"],
            &["handoff-client", "7450", "8"],
            "client.handed: 8 of 8",
        ),
        (
            &["inetd", "7451", "4"],
            &["inetd-client", "7451", "4"],
            "client.inetd: 4 of 4",
        ),
        (
            &["leave", "7452"],
            &["inetd-client", "7452", "1"],
            "client.inetd: 1 of 1",
        ),
    ];
    for (srv, cli, want) in runs {
        let server_args: Vec<&str> = std::iter::once(b).chain(srv.iter().copied()).collect();
        let client_args = |ip: &str| -> Vec<String> {
            [b, cli[0], ip]
                .into_iter()
                .chain(cli[1..].iter().copied())
                .map(String::from)
                .collect()
        };
        let kargs = client_args("127.0.0.1");
        let kargs: Vec<&str> = kargs.iter().map(String::as_str).collect();
        let (ks, kc) = kernel_pair(&server_args, &kargs, true);
        assert!(kc.contains(want), "kernel {srv:?}: {kc}");
        same_outcomes_as_the_kernels(
            &format!("{srv:?}"),
            &[dir.path()],
            &server_args,
            &client_args,
            (&kc, &ks),
        );
    }
}

/// A server that forks from its signal handlers, as PostgreSQL 15's postmaster starts its
/// workers: its signals are blocked but while it waits in `select`, and one arrives every
/// 200 us (a handler that forks a child that exits at once; another that reaps), while the
/// connections it handed to children carry a megabyte each way through it. The handlers run
/// where the kernel would run them (the library's wait asleep, or its return), never inside
/// the library's work: there, a fork waited forever for a lock the interrupted call held (5
/// runs of 5 hung so). The outcomes are the kernel's, through the daemon and over a fast
/// channel.
#[test]
fn a_server_whose_signal_handlers_fork_while_it_waits_in_select_serves_every_connection() {
    if !ready("preload postmaster", &[("cc", "gcc")]) {
        return;
    }
    let dir = workdir("postmaster");
    let bin = compile_c(&dir, "forked");
    let b = bin.to_str().unwrap();
    let server = [b, "postmaster", "7453", "8"];
    let client_args = |ip: &str| -> Vec<String> {
        [b, "handoff-client", ip, "7453", "8"]
            .into_iter()
            .map(String::from)
            .collect()
    };
    let (ks, kc) = kernel_pair(
        &server,
        &[b, "handoff-client", "127.0.0.1", "7453", "8"],
        true,
    );
    assert!(kc.contains("client.handed: 8 of 8"), "kernel: {kc}");
    assert!(
        ks.contains("postmaster.served: 8 of 8, aux forks 1"),
        "kernel: {ks}"
    );
    same_outcomes_as_the_kernels(
        "postmaster",
        &[dir.path()],
        &server,
        &client_args,
        (&kc, &ks),
    );
}

/// PostgreSQL as Debian ships it: the postmaster accepts each connection and forks a backend
/// that serves it, closing its own copy at once. pgbench initialises its tables and runs the
/// select-only and the default TPC-B-like transactions with 4 clients for 2 s each, every one
/// of them through a backend the postmaster handed its connection to, over a fast channel.
#[test]
fn postgresql_serves_pgbench_from_the_backends_its_postmaster_forks() {
    if !ready("preload postgresql", &[("pgbench", "postgresql")]) {
        return;
    }
    let Some(bin) = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .find(|b| b.join("postgres").is_file())
    else {
        eprintln!("skipping preload postgresql: no /usr/lib/postgresql/*/bin/postgres");
        return;
    };
    let bin = bin.to_str().unwrap();
    let (lab, s, c, ip) = lab(true);
    let server_sh = format!(
        "set -e; {bin}/initdb -D /tmp/pg -A trust -U postgres >/dev/null; \
         echo 'host all all 0.0.0.0/0 trust' >> /tmp/pg/pg_hba.conf; \
         exec {bin}/postgres -D /tmp/pg -k /tmp -c listen_addresses='*' -c fsync=off"
    );
    let mut sc = lab.cmd();
    sc.args(["run", "--pipe", &s, "--preload", "--user", "postgres", "--"])
        .args(["bash", "-c", &server_sh]);
    let server = Server::spawn(sc, Stdio::piped());
    let client_sh = format!(
        "for i in $(seq 100); do {bin}/pg_isready -q -h {ip} && break; sleep 0.1; done; \
         pgbench -q -i -h {ip} -U postgres postgres 2>&1 | tail -1 && \
         pgbench -n -S -c 4 -j 2 -T 2 -h {ip} -U postgres postgres && \
         pgbench -n -c 4 -j 2 -T 2 -h {ip} -U postgres postgres"
    );
    let mut cc = lab.cmd();
    cc.args(["run", "--pipe", &c, "--preload", "--user", "postgres", "--"])
        .args(["timeout", "100", "bash", "-c", &client_sh]);
    let o = cc.output().expect("the client container");
    let out = must(&o, "pgbench");
    drop(server);
    assert!(out.contains("done in"), "pgbench -i: {out}");
    assert_eq!(
        out.matches("number of failed transactions: 0 (0.000%)")
            .count(),
        2,
        "{out}"
    );
    for line in out
        .lines()
        .filter(|l| l.starts_with("number of transactions actually"))
    {
        let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n > 100, "{line}\n{out}");
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("docknet-preload"), "{err}");
}

/// Servers that fork their workers after they listen (the workers wait in epoll, or block in
/// accept), and programs that daemonize (the parent exits; the child listens, or uses the
/// listener the parent made): every connection is answered over DockNet as on kernel sockets,
/// through the daemon and over a fast channel. Over DockNet the first worker that uses the
/// listener takes the pipe's stack and serves the connections (one at a time, as these come, it
/// keeps up and hands none on).
#[test]
fn servers_that_fork_after_they_listen_or_daemonize_answer_as_on_kernel_sockets() {
    if !ready("preload prefork", &[("cc", "gcc")]) {
        return;
    }
    let dir = workdir("prefork");
    let bin = compile_c(&dir, "prefork");
    let b = bin.to_str().unwrap();
    let modes: [&[&str]; 4] = [
        &["workers", "7500", "2"],
        &["blocking", "7501", "2"],
        &["daemon", "7502"],
        &["daemon-late", "7503"],
    ];
    // the daemon's child keeps the pipe to `cat` open: the server ends when the child does
    let server_cmd = |m: &[&str]| format!("{b} {} | cat", m.join(" "));
    for m in modes {
        let port = m[1];
        let (ks, kc) = kernel_pair(
            &["sh", "-c", &server_cmd(m)],
            &[b, "client", "127.0.0.1", port, "5"],
            true,
        );
        assert!(kc.contains("client.answered: 5"), "kernel {m:?}: {kc}");
        assert!(ks.contains("served: 5"), "kernel {m:?}: {ks}");
        same_outcomes_as_the_kernels(
            &format!("{m:?}"),
            &[dir.path()],
            &["sh", "-c", &server_cmd(m)],
            &|ip| {
                [b, "client", ip, port, "5"]
                    .into_iter()
                    .map(String::from)
                    .collect()
            },
            (&kc, &ks),
        );
    }
}

/// A listener shared by blocking workers that each take 100 ms over an answer (a pool of
/// synchronous workers, as gunicorn's), and eight connections at once: on kernel sockets all
/// four workers answer some. Over DockNet the worker that took the pipe's stack hands the
/// connections it does not accept in time to the others (`share`), through the daemon and over
/// a fast channel; before, it answered all eight itself while the others slept. A process of
/// the same container that is not of the server's family is refused at the Unix socket those
/// connections go through, whatever it sends.
#[test]
fn a_listener_shared_by_slow_workers_spreads_its_connections_over_them() {
    if !ready("preload prefork slow", &[("cc", "gcc")]) {
        return;
    }
    let dir = workdir("prefork-slow");
    let bin = compile_c(&dir, "prefork");
    let b = bin.to_str().unwrap();
    let (ks, kc) = kernel_pair(
        &[b, "slow", "7505", "4"],
        &[b, "parallel", "127.0.0.1", "7505", "8"],
        true,
    );
    assert!(kc.contains("client.answered: 8"), "kernel: {kc}");
    assert!(busy_workers(&ks) >= 2, "kernel: {ks}");
    assert!(!ks.contains("listener.wrong"), "kernel: {ks}");
    // beside the server, a process of the same container and user, not of its family, at the
    // Unix socket the workers get their connections through
    let server = format!("{b} slow 7505 4 & sleep 0.5; {b} intrude; wait");
    for fc in [false, true] {
        let (lab, s, c, ip) = lab(fc);
        let mut srv = Server::spawn(
            run_args(&lab, &s, &[dir.path()], &[], &["sh", "-c", &server]),
            Stdio::piped(),
        );
        // (before any connection: the intruder looks while the workers wait)
        let first = [srv.line(), srv.line()];
        assert!(
            first.iter().any(|l| l.starts_with("workers: 4")),
            "fast channel {fc}: {first:?}"
        );
        // a wrong token (in a hello and in a request for a connection), garbage and silence:
        // each dropped, nothing handed over
        assert!(
            first.iter().any(|l| l.starts_with("intruder.dropped: 4")),
            "fast channel {fc}: {first:?}"
        );
        let o = client(
            &lab,
            &c,
            &[dir.path()],
            &[],
            &[b, "parallel", &ip, "7505", "8"],
            Duration::from_secs(60),
        );
        assert!(
            must(&o, "the client").contains("client.answered: 8"),
            "fast channel {fc}"
        );
        let so = srv.finish(Duration::from_secs(30));
        let (out, err) = (text(&so), String::from_utf8_lossy(&so.stderr));
        assert!(out.contains("served: 8"), "fast channel {fc}: {out}\n{err}");
        // the listener each worker accepts on, and the connections, answer as the kernel's
        assert!(
            !out.contains("listener.wrong"),
            "fast channel {fc}: {out}\n{err}"
        );
        assert!(
            busy_workers(&out) >= 2,
            "fast channel {fc}: one worker answered every connection\n{out}\n{err}"
        );

        assert!(!err.contains("docknet-preload"), "fast channel {fc}: {err}");
    }
}

/// Workers whose sibling drives the pipe's stack connect to another container (a database, an
/// upstream) as the one that drives it does: it makes the connection for them and relays it.
/// Four blocking workers each ask a backend container before they answer, and 8 connections
/// come at once, so several workers answer (as on kernel sockets, where the backend is on
/// loopback). Before, the workers that did not drive the stack had no route to DockNet: every
/// such dial failed with ENETUNREACH.
#[test]
fn workers_whose_sibling_drives_the_stack_connect_to_other_containers_through_it() {
    if !ready("preload prefork dial", &[("cc", "gcc")]) {
        return;
    }
    let dir = workdir("prefork-dial");
    let bin = compile_c(&dir, "prefork");
    let b = bin.to_str().unwrap();
    let server = format!(
        "{b} workers 7508 1 >/dev/null & sleep 0.3; {b} dial 7507 4 127.0.0.1 7508; \
         {b} client 127.0.0.1 7508 0 >/dev/null; wait"
    );
    let (ks, kc) = kernel_pair(
        &["sh", "-c", &server],
        &[b, "parallel", "127.0.0.1", "7507", "8"],
        true,
    );
    assert!(kc.contains("client.answered: 8"), "kernel: {kc}");
    assert!(
        busy_workers(&ks) >= 2 && !ks.contains("dial.failed"),
        "kernel: {ks}"
    );
    for fc in [false, true] {
        let (lab, s, c, ip) = lab(fc);
        // the backend: a container of its own beside the two
        let be = format!("be{}", s.trim_start_matches("pls"));
        let be_ip = ip.replace(".2", ".4");
        let net = ip.rsplit_once('.').map(|x| x.0).unwrap_or_default();
        lab.ok(&["pipe", "create", &be, "--ip", &format!("{net}.4/24")]);
        if fc {
            lab.ok(&["fc", "connect", &s, &be]);
        }
        // (listening once it says so: a dial before that would be refused)
        let mut backend = Server::spawn(
            run_args(&lab, &be, &[dir.path()], &[], &[b, "workers", "7508", "1"]),
            Stdio::piped(),
        );
        assert!(
            backend.line().starts_with("workers: 1"),
            "fast channel {fc}"
        );
        let mut srv = Server::spawn(
            run_args(
                &lab,
                &s,
                &[dir.path()],
                &[],
                &[b, "dial", "7507", "4", &be_ip, "7508"],
            ),
            Stdio::piped(),
        );
        assert!(srv.line().starts_with("workers: 4"), "fast channel {fc}");
        let o = client(
            &lab,
            &c,
            &[dir.path()],
            &[],
            &[b, "parallel", &ip, "7507", "8"],
            Duration::from_secs(60),
        );
        let so = srv.finish(Duration::from_secs(30));
        let (out, err) = (text(&so), String::from_utf8_lossy(&so.stderr));
        assert!(
            must(&o, "the client").contains("client.answered: 8"),
            "fast channel {fc}: {out}\n{err}"
        );
        assert!(
            out.contains("served: 8") && !out.contains("dial.failed"),
            "fast channel {fc}: {out}\n{err}"
        );
        assert!(
            busy_workers(&out) >= 2,
            "fast channel {fc}: one worker answered every connection\n{out}\n{err}"
        );
        assert!(!err.contains("docknet-preload"), "fast channel {fc}: {err}");
    }
}

/// A fast channel made after a server forked its worker and before the worker took the pipe's
/// stack: the parent's engine, asleep since before the fork, is woken by the daemon's kick, and
/// must leave the channel's message on the family's connection to the daemon for the worker
/// that takes the stack (read by the parent, the channel was lost to the worker, which then
/// never read what the client sent on it: every connection hung).
#[test]
fn a_channel_made_while_a_forked_worker_has_not_taken_the_stack_is_the_workers() {
    if !ready("preload prefork channel", &[("cc", "gcc")]) {
        return;
    }
    let dir = workdir("prefork-fc");
    let bin = compile_c(&dir, "prefork");
    let b = bin.to_str().unwrap();
    let (lab, s, c, ip) = lab(false);
    let mut srv = Server::spawn(
        run_args(
            &lab,
            &s,
            &[dir.path()],
            &[],
            &[b, "workers", "7504", "1", "1000"],
        ),
        Stdio::piped(),
    );
    let line = srv.line();
    assert!(line.starts_with("workers: 1"), "{line}");
    // the worker waits a second before it uses the listener, the parent's engine sleeps
    lab.ok(&["fc", "connect", &s, &c]);
    let o = client(
        &lab,
        &c,
        &[dir.path()],
        &[],
        &[b, "client", &ip, "7504", "3"],
        Duration::from_secs(30),
    );
    assert!(must(&o, "the client").contains("client.answered: 3"));
    let so = srv.finish(Duration::from_secs(30));
    assert!(text(&so).contains("served: 3"), "{}", text(&so));
    let err = String::from_utf8_lossy(&so.stderr);
    assert!(!err.contains("docknet-preload"), "{err}");
}

/// nginx with its default process model (a master that listens and forks `worker_processes
/// auto` workers, one per core): the first worker that uses the listener takes the pipe's
/// stack, and curl's file comes back intact, through the daemon and over a fast channel.
#[test]
fn curl_fetches_a_file_from_nginx_intact_and_wrk_loads_it() {
    if !ready(
        "preload nginx",
        &[
            ("nginx", "nginx-light"),
            ("curl", "curl"),
            ("wrk", "wrk"),
            ("sha256sum", "coreutils"),
        ],
    ) {
        return;
    }
    let _one = one_at_a_time();
    let dir = workdir("nginx");
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    std::fs::write(www.join("file.bin"), &data).unwrap();
    std::fs::write(www.join("small.txt"), b"hello from nginx\n").unwrap();
    let conf = dir.path().join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nworker_processes auto;\nerror_log stderr warn;\npid /tmp/nginx.pid;\n\
             events {{ worker_connections 1024; }}\n\
             http {{ access_log off; sendfile on;\n client_body_temp_path /tmp/b; proxy_temp_path /tmp/p; fastcgi_temp_path /tmp/f; uwsgi_temp_path /tmp/u; scgi_temp_path /tmp/s;\n\
             server {{ listen 80; root {}; }} }}\n",
            www.display()
        ),
    )
    .unwrap();
    let sum = |b: &[u8]| -> String {
        let t = dir.path().join("expect.bin");
        std::fs::write(&t, b).unwrap();
        let o = Command::new("sha256sum").arg(&t).output().unwrap();
        text(&o).split_whitespace().next().unwrap().to_string()
    };
    let want = sum(&data);
    for fc in [false, true] {
        let (lab, s, c, ip) = lab(fc);
        let d = dir.path();
        let _srv = Server::start(&lab, &s, &[d], &["nginx", "-c", conf.to_str().unwrap()]);
        let script = format!(
            "for i in 1 2 3 4 5 6 7 8 9 10; do curl -sS -o /tmp/got.bin http://{ip}/file.bin && break; sleep 0.2; done; sha256sum /tmp/got.bin; \
             wrk -t1 -c4 -d1s http://{ip}/small.txt"
        );
        let o = client(
            &lab,
            &c,
            &[d],
            &[],
            &["sh", "-c", &script],
            Duration::from_secs(60),
        );
        let out = must(&o, "curl and wrk");
        let got = out.split_whitespace().next().unwrap_or("");
        assert_eq!(
            got, want,
            "fast channel {fc}: the file came back different: {out}"
        );
        let rps: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("Requests/sec:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no wrk figure: {out}"));
        assert!(rps > 100.0, "wrk: {rps} requests/s\n{out}");
        assert!(!out.contains("Non-2xx"), "wrk saw errors: {out}");
    }
}

/// nginx as a reverse proxy (one process driving its client and upstream connections from
/// one epoll loop, with its own eventfd in the set) in front of docknet-httpd, through the
/// daemon and over fast channels: each of 100 responses of 1 MB, which nginx spools through a
/// temporary file, must end within 2 s (they take about 10 ms). A connection that nginx closed
/// while the library's notifier still held its socket once stayed open for good (no FIN, the
/// client waiting for the end of the response), about once in 30 responses (the same
/// clients with curl did not show it). Then nginx must stop on SIGTERM.
#[test]
fn a_reverse_proxy_ends_every_response_at_once() {
    if !ready(
        "preload proxy",
        &[
            ("nginx", "nginx-light"),
            ("curl", "curl"),
            ("python3", "python3"),
        ],
    ) {
        return;
    }
    let _one = one_at_a_time();
    let dir = workdir("proxy");
    for fc in [false, true] {
        let (lab, s, c, ip) = lab(fc);
        // the backend on a pipe of its own, on DockLib
        let backend = format!("{s}b");
        let bip = ip.rsplit_once('.').map(|(n, _)| format!("{n}.4")).unwrap();
        lab.ok(&["pipe", "create", &backend, "--ip", &format!("{bip}/24")]);
        if fc {
            lab.ok(&["fc", "connect", &s, &backend]);
        }
        let mut httpd = lab.cmd();
        httpd.args(["run", "--pipe", &backend, "--"]).args([
            env!("CARGO_BIN_EXE_docknet-httpd"),
            "--stack",
            "docknet",
            "--bind",
            &format!("{bip}:8080"),
        ]);
        let _backend = Server::spawn(httpd, Stdio::null());
        let conf = dir.path().join(format!("proxy-{fc}.conf"));
        std::fs::write(
            &conf,
            format!(
                "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log stderr warn;\npid /tmp/nginx.pid;\n\
                 events {{ worker_connections 256; }}\n\
                 http {{ access_log off;\n client_body_temp_path /tmp/b; proxy_temp_path /tmp/p; fastcgi_temp_path /tmp/f; uwsgi_temp_path /tmp/u; scgi_temp_path /tmp/s;\n\
                 server {{ listen 8081; location / {{ proxy_pass http://{bip}:8080; }} }} }}\n"
            ),
        )
        .unwrap();
        let d = dir.path();
        let proxy = Server::start(&lab, &s, &[d], &["nginx", "-c", conf.to_str().unwrap()]);
        // ten clients one after another, ten requests each, each on a new connection
        let fetch = d.join("fetch.py");
        std::fs::write(
            &fetch,
            "import socket, sys, time\n\
             for i in range(10):\n\
             \x20   t = time.time()\n\
             \x20   s = socket.create_connection((sys.argv[1], 8081), timeout=20)\n\
             \x20   s.sendall(b'GET /bytes/1000000 HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n')\n\
             \x20   n = 0\n\
             \x20   while True:\n\
             \x20       d = s.recv(65536)\n\
             \x20       if not d: break\n\
             \x20       n += len(d)\n\
             \x20   s.close()\n\
             \x20   print(n, round(time.time() - t, 4), flush=True)\n",
        )
        .unwrap();
        let script = format!(
            "for i in 1 2 3 4 5 6 7 8 9 10; do curl -sS -o /dev/null http://{ip}:8081/bytes/10 && break; sleep 0.2; done; \
             for k in 1 2 3 4 5 6 7 8 9 10; do /usr/bin/python3 {} {ip} || exit 1; done",
            fetch.display()
        );
        let o = client(
            &lab,
            &c,
            &[d],
            &[],
            &["sh", "-c", &script],
            Duration::from_secs(300),
        );
        let out = must(&o, "the clients through the proxy");
        let times: Vec<f64> = out
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // the body and nginx's headers
                let n: usize = f[0].parse().unwrap();
                assert!(
                    (1_000_000..1_001_000).contains(&n),
                    "fast channel {fc}: {l}"
                );
                f[1].parse().unwrap()
            })
            .collect();
        assert_eq!(times.len(), 100, "fast channel {fc}: {out}");
        let slow: Vec<&f64> = times.iter().filter(|t| **t > 2.0).collect();
        assert!(
            slow.is_empty(),
            "fast channel {fc}: responses that did not end at once (s): {slow:?}"
        );
        // told to stop, nginx stops: the signal must reach the thread asleep in epoll_wait, not
        // a thread of the library's
        let pid = proxy.0.as_ref().unwrap().id().to_string();
        let term = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(term.success());
        proxy.finish(Duration::from_secs(5));
    }
}

#[test]
fn redis_benchmark_runs_get_and_set_against_redis_and_a_value_reads_back() {
    if !ready(
        "preload redis",
        &[
            ("redis-server", "redis-server"),
            ("redis-benchmark", "redis-tools"),
            ("redis-cli", "redis-tools"),
        ],
    ) {
        return;
    }
    let (lab, s, c, ip) = lab(true);
    let _srv = Server::start(
        &lab,
        &s,
        &[],
        &[
            "redis-server",
            "--bind",
            "0.0.0.0",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            "/tmp",
        ],
    );
    let value = format!("docknet-{}", std::process::id());
    let script = format!(
        "echo 'step: ping' >&2; for i in 1 2 3 4 5 6 7 8 9 10; do redis-cli -h {ip} ping 2>/dev/null | grep -q PONG && break; sleep 0.2; done; \
         echo 'step: set' >&2; redis-cli -h {ip} set checked {value} && echo 'step: benchmark' >&2 && \
         redis-benchmark -h {ip} -t set,get -n 5000 -c 10 -d 64 -q && echo 'step: get' >&2 && redis-cli -h {ip} get checked"
    );
    let o = client(
        &lab,
        &c,
        &[],
        &[],
        &["sh", "-c", &script],
        Duration::from_secs(60),
    );
    let out = must(&o, "redis-cli and redis-benchmark");
    for t in ["SET", "GET"] {
        let rps: f64 = out
            .split(['\r', '\n'])
            .rev()
            .filter_map(|l| l.trim().strip_prefix(&format!("{t}: ")))
            .find_map(|r| r.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {t} figure: {out}"));
        assert!(rps > 100.0, "{t}: {rps} requests/s");
    }
    assert_eq!(
        out.lines().last().map(str::trim),
        Some(value.as_str()),
        "{out}"
    );
}

#[test]
fn iperf3_and_sockperf_complete_through_the_daemon_and_over_a_fast_channel() {
    if !ready(
        "preload iperf3 and sockperf",
        &[("iperf3", "iperf3"), ("sockperf", "sockperf")],
    ) {
        return;
    }
    let _one = one_at_a_time();
    for fc in [false, true] {
        let (lab, s, c, ip) = lab(fc);
        {
            let _srv = Server::start(&lab, &s, &[], &["iperf3", "-s", "-B", &ip, "-p", "5201"]);
            let script = format!(
                "for i in 1 2 3 4 5 6 7 8 9 10; do iperf3 -c {ip} -p 5201 -t 1 -l 1024 -J > /tmp/i.json && break; sleep 0.3; done; cat /tmp/i.json"
            );
            let o = client(
                &lab,
                &c,
                &[],
                &[],
                &["sh", "-c", &script],
                Duration::from_secs(60),
            );
            let out = must(&o, "iperf3");
            let v: serde_json::Value =
                serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
            let bps = v["end"]["sum_received"]["bits_per_second"]
                .as_f64()
                .unwrap_or(0.0);
            assert!(bps > 1e6, "fast channel {fc}: iperf3 {bps} bit/s");
        }
        {
            let _srv = Server::start(
                &lab,
                &s,
                &[],
                &["sockperf", "server", "--tcp", "-i", &ip, "-p", "11111"],
            );
            let script = format!(
                "for i in 1 2 3 4 5 6 7 8 9 10; do sockperf ping-pong --tcp -i {ip} -p 11111 -m 64 -t 1 --mps 10000000 > /tmp/s.txt 2>&1 && grep -q Summary /tmp/s.txt && break; sleep 0.3; done; cat /tmp/s.txt"
            );
            let o = client(
                &lab,
                &c,
                &[],
                &[],
                &["sh", "-c", &script],
                Duration::from_secs(60),
            );
            let out = must(&o, "sockperf");
            assert!(
                out.contains("Summary: Latency is"),
                "fast channel {fc}: {out}"
            );
            assert!(!out.contains("ERROR"), "{out}");
        }
    }
}

#[test]
fn the_lab_measures_docknet_with_sockperf_and_iperf3_on_the_preload_modes() {
    if !ready(
        "preload lab modes",
        &[
            ("sockperf", "sockperf"),
            ("iperf3", "iperf3"),
            ("taskset", "util-linux"),
        ],
    ) {
        return;
    }
    let _one = one_at_a_time();
    let dir = workdir("lab");
    for (workload, tool, modes) in [
        ("rr", "sockperf", "docknet-fc-preload"),
        ("stream", "iperf3", "docknet-preload"),
    ] {
        let json = dir.path().join(format!("{workload}.json"));
        let o = Command::new(EXE)
            .args([
                "bench",
                workload,
                "--modes",
                modes,
                "--sizes",
                "1024",
                "--crosscheck",
            ])
            .args(["--duration", "1", "--warmup", "0.2", "--json"])
            .arg(&json)
            .output()
            .unwrap();
        must(&o, &format!("docknet bench {workload}"));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let rows = v["results"].as_array().unwrap();
        let of = |t: &str| rows.iter().find(|r| r["mode"] == modes && r["tool"] == t);
        let (d, x) = (of("dnperf"), of(tool));
        assert!(d.is_some() && x.is_some(), "{workload}: rows {rows:?}");
        let figure = if workload == "rr" { "p50_us" } else { "gbps" };
        for r in [d.unwrap(), x.unwrap()] {
            let f = r[figure].as_f64().unwrap_or(0.0);
            assert!(f > 0.0, "{workload}: {figure} {f} in {r}");
        }
    }
}
