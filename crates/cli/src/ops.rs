//! What operators run against a live daemon: `docknet capture` (a pipe's frames into a pcap
//! file) and `docknet top` (pipes by traffic, drops, limits, and the masters' load).

use anyhow::{bail, Context, Result};
use docknet_daemon::capture::{read_record, Dir, Summary};
use docknet_daemon::proto::{Client, Stats};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, TsResolution};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Mirror a pipe's frames (both directions) into a pcap file that tcpdump and Wireshark read.
///
/// The daemon copies each frame it moves for the pipe (what the container sends and what is
/// delivered to it) into a bounded capture queue; a frame that finds the queue full is left
/// out of the capture and counted, never dropped from the pipe. Frames on the pipe's fast
/// channels go between the partners without the daemon and are not captured. Filter with
/// tcpdump: `docknet capture web -w - | tcpdump -r - 'tcp port 80'`.
#[derive(Debug, clap::Args)]
pub struct CaptureArgs {
    /// The pipe.
    pub name: String,
    /// Stop after this many frames [default: until Ctrl-C or the pipe is removed].
    #[arg(short = 'c', long)]
    pub count: Option<u64>,
    /// Bytes kept of each frame (64 to 65535).
    #[arg(short = 's', long, default_value_t = 65535, value_parser = clap::value_parser!(u32).range(64..=65535))]
    pub snaplen: u32,
    /// The pcap file to write (nanosecond timestamps, Ethernet), or `-` for standard output.
    #[arg(short = 'w', long = "write", value_name = "FILE")]
    pub write: PathBuf,
    /// Print the summary as JSON (on standard error when writing to standard output).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct CaptureReport {
    pipe: String,
    file: String,
    captured: u64,
    sent: u64,
    received: u64,
    /// `None` when the daemon sent no summary.
    dropped_from_capture: Option<u64>,
    ended: String,
    not_captured_fast_channels: Vec<String>,
}

/// How long `docknet capture` waits, after Ctrl-C, for the rest of the frames and the summary.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// `docknet capture`.
pub fn capture(socket: &Path, a: CaptureArgs) -> Result<()> {
    let to_stdout = a.write.as_os_str() == "-";
    let client = Client::connect(socket)?;
    let (started, mut rd) = client
        .capture(&a.name, Some(a.snaplen), a.count)
        .with_context(|| format!("capturing pipe {}", a.name))?;
    let out: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            std::fs::File::create(&a.write)
                .with_context(|| format!("creating {}", a.write.display()))?,
        )
    };
    let header = PcapHeader {
        snaplen: started.snaplen,
        datalink: DataLink::ETHERNET,
        ts_resolution: TsResolution::NanoSecond,
        ..PcapHeader::default()
    };
    let mut w = PcapWriter::with_header(std::io::BufWriter::new(out), header)
        .context("writing the pcap header")?;
    // Ctrl-C ends the capture cleanly: the sending side of the connection is shut, the daemon
    // sends what its tap still holds and the summary (with how many frames the capture left
    // out), and the file is complete. A daemon that does not answer within a few seconds ends
    // the capture with what was read.
    let sock = rd
        .get_ref()
        .try_clone()
        .context("cloning the capture socket")?;
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing the signal handler")?;
    let handle = signals.handle();
    let stopper = std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let _ = sock.set_read_timeout(Some(STOP_WAIT));
            let _ = sock.shutdown(std::net::Shutdown::Write);
        }
    });
    if !started.fast_channels.is_empty() {
        eprintln!(
            "docknet capture: the fast channels of {} (with {}) bypass the daemon: their frames are not captured",
            a.name,
            started.fast_channels.join(", ")
        );
    }
    if !to_stdout {
        eprintln!(
            "docknet capture: {} -> {} (snap length {}{}); Ctrl-C to stop",
            a.name,
            a.write.display(),
            started.snaplen,
            a.count.map(|c| format!(", {c} frames")).unwrap_or_default()
        );
    }
    let (mut sent, mut received) = (0u64, 0u64);
    let mut summary: Option<Summary> = None;
    loop {
        match read_record(&mut rd) {
            Ok(Some(Ok(r))) => {
                match r.dir {
                    Dir::Out => sent += 1,
                    Dir::In => received += 1,
                }
                let ts = Duration::from_nanos(r.ts_ns);
                w.write_packet(&PcapPacket::new(ts, r.orig_len, &r.data))
                    .context("writing a frame")?;
            }
            Ok(Some(Err(s))) => {
                summary = Some(s);
                break;
            }
            Ok(None) => break,
            // Ctrl-C in the middle of a record, or the daemon went away: what was read stays
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                bail!("the daemon's capture stream is corrupt: {e}")
            }
            Err(_) => break,
        }
    }
    handle.close();
    let _ = stopper.join();
    let mut out = w.into_writer();
    out.flush().context("writing the pcap file")?;
    drop(out);
    // without the daemon's summary (it went away, or did not answer within STOP_WAIT) the
    // frames left out are not known
    let known = summary.is_some();
    let s = summary.unwrap_or(Summary {
        captured: sent + received,
        dropped: 0,
        ended: "daemon".into(),
    });
    let report = CaptureReport {
        pipe: a.name.clone(),
        file: a.write.display().to_string(),
        captured: sent + received,
        sent,
        received,
        dropped_from_capture: known.then_some(s.dropped),
        ended: s.ended,
        not_captured_fast_channels: started.fast_channels,
    };
    if a.json {
        let j = serde_json::to_string_pretty(&report)?;
        if to_stdout {
            eprintln!("{j}");
        } else {
            println!("{j}");
        }
    } else {
        eprintln!(
            "docknet capture: {} frames ({} sent by {}, {} delivered to it){}; ended: {}",
            report.captured,
            sent,
            a.name,
            received,
            match report.dropped_from_capture {
                Some(0) => String::new(),
                Some(n) => format!(
                    ", {n} left out of the capture (the reader was too slow; the pipe lost none)"
                ),
                None => ", frames left out not known (no summary from the daemon)".into(),
            },
            report.ended
        );
    }
    Ok(())
}

/// Pipes sorted by traffic, with drops, rate limits and the masters' load, refreshed every
/// interval (q or Ctrl-C quits, s changes the order). With `--once`, two samples an interval
/// apart are printed as a table (or JSON) for scripts.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Print one sample (rates over one interval) and exit.
    #[arg(long)]
    pub once: bool,
    /// With --once: print JSON.
    #[arg(long, requires = "once")]
    pub json: bool,
    /// Seconds between samples.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Order of the pipes.
    #[arg(long, value_enum, default_value_t = SortBy::Traffic)]
    pub sort: SortBy,
}

/// What `docknet top` sorts pipes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SortBy {
    /// Bytes per second, both directions.
    Traffic,
    /// Drops per second.
    Drops,
    /// Name.
    Name,
}

impl SortBy {
    fn next(self) -> SortBy {
        match self {
            SortBy::Traffic => SortBy::Drops,
            SortBy::Drops => SortBy::Name,
            SortBy::Name => SortBy::Traffic,
        }
    }
}

/// One pipe's rates over an interval.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PipeRates {
    pipe: String,
    ip: String,
    rx_pps: f64,
    rx_bps: f64,
    tx_pps: f64,
    tx_bps: f64,
    drops_per_s: f64,
    drops_total: u64,
    rate_waits_per_s: f64,
    egress_limit_bps: Option<u64>,
    ingress_limit_bps: Option<u64>,
    fast_channels: usize,
    connections: usize,
}

/// One master's load over an interval.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct MasterRates {
    master: usize,
    pipes: u64,
    /// Share of the interval in rounds that moved frames, %.
    busy_pct: f64,
    /// Awake without work, %.
    idle_pct: f64,
    /// Asleep, %.
    asleep_pct: f64,
    frames_per_s: f64,
    rounds_per_s: f64,
}

/// A sample: rates between two `stats` replies.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Sample {
    interval_s: f64,
    sort: Option<SortBy>,
    pipes: Vec<PipeRates>,
    masters: Vec<MasterRates>,
    forwarded_per_s: f64,
    captures: usize,
}

const DROP_COUNTERS: &[&str] = &[
    "drop_rx_full",
    "drop_no_route",
    "drop_spoofed",
    "drop_malformed",
    "drop_unsupported",
    "drop_too_big",
    "bad_desc",
    "oversize",
    "ring_overrun",
    "drop_flood_limited",
    "flood_rx_full",
    "rate_limited",
    "drop_wire",
    "drop_ext_header",
];

fn rates(a: &Stats, b: &Stats, sort: SortBy) -> Sample {
    let dt = (b.at_ns.saturating_sub(a.at_ns) as f64 / 1e9).max(1e-6);
    let before: BTreeMap<&str, &BTreeMap<String, u64>> = a
        .pipes
        .iter()
        .filter_map(|p| Some((p.name.as_str(), p.counters.as_ref()?)))
        .collect();
    let empty = BTreeMap::new();
    let limits: BTreeMap<&str, (Option<u64>, Option<u64>)> = b
        .limits
        .iter()
        .map(|r| (r.pipe.as_str(), (r.egress_bps, r.ingress_bps)))
        .collect();
    let mut pipes: Vec<PipeRates> = b
        .pipes
        .iter()
        .map(|p| {
            let now = p.counters.as_ref().unwrap_or(&empty);
            let then = before.get(p.name.as_str()).copied().unwrap_or(now);
            let d = |k: &str| {
                now.get(k)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(then.get(k).copied().unwrap_or(0)) as f64
                    / dt
            };
            let total = |m: &BTreeMap<String, u64>| -> u64 {
                DROP_COUNTERS
                    .iter()
                    .map(|k| m.get(*k).copied().unwrap_or(0))
                    .sum()
            };
            let (eg, ing) = limits.get(p.name.as_str()).copied().unwrap_or((None, None));
            PipeRates {
                pipe: p.name.clone(),
                ip: p.ip.clone(),
                rx_pps: d("rx_packets"),
                rx_bps: d("rx_bytes") * 8.0,
                tx_pps: d("tx_packets"),
                tx_bps: d("tx_bytes") * 8.0,
                drops_per_s: total(now).saturating_sub(total(then)) as f64 / dt,
                drops_total: total(now),
                rate_waits_per_s: d("rate_waits"),
                egress_limit_bps: eg,
                ingress_limit_bps: ing,
                fast_channels: p.fast_channels.len(),
                connections: p.connections,
            }
        })
        .collect();
    sort_pipes(&mut pipes, sort);
    let masters = b
        .masters
        .iter()
        .map(|m| {
            let o = a
                .masters
                .iter()
                .find(|x| x.master == m.master)
                .cloned()
                .unwrap_or_default();
            let pct = |x: u64, y: u64| (x.saturating_sub(y) as f64 / 1e9 / dt * 100.0).min(100.0);
            MasterRates {
                master: m.master,
                pipes: m.pipes,
                busy_pct: pct(m.busy_ns, o.busy_ns),
                idle_pct: pct(m.idle_ns, o.idle_ns),
                asleep_pct: pct(m.asleep_ns, o.asleep_ns),
                frames_per_s: m.frames.saturating_sub(o.frames) as f64 / dt,
                rounds_per_s: m.rounds.saturating_sub(o.rounds) as f64 / dt,
            }
        })
        .collect();
    Sample {
        interval_s: dt,
        sort: Some(sort),
        pipes,
        masters,
        forwarded_per_s: b.forwarded.saturating_sub(a.forwarded) as f64 / dt,
        captures: b.captures,
    }
}

fn sort_pipes(p: &mut [PipeRates], by: SortBy) {
    match by {
        SortBy::Traffic => p.sort_by(|a, b| {
            (b.rx_bps + b.tx_bps)
                .total_cmp(&(a.rx_bps + a.tx_bps))
                .then_with(|| a.pipe.cmp(&b.pipe))
        }),
        SortBy::Drops => p.sort_by(|a, b| {
            b.drops_per_s
                .total_cmp(&a.drops_per_s)
                .then_with(|| b.drops_total.cmp(&a.drops_total))
                .then_with(|| a.pipe.cmp(&b.pipe))
        }),
        SortBy::Name => p.sort_by(|a, b| a.pipe.cmp(&b.pipe)),
    }
}

/// `1234567` -> `1.23M`.
fn si(x: f64) -> String {
    let (v, u) = match x {
        x if x >= 1e9 => (x / 1e9, "G"),
        x if x >= 1e6 => (x / 1e6, "M"),
        x if x >= 1e3 => (x / 1e3, "k"),
        x => (x, ""),
    };
    if u.is_empty() {
        format!("{v:.0}")
    } else {
        format!("{v:.2}{u}")
    }
}

fn limit(e: Option<u64>, i: Option<u64>) -> String {
    match (e, i) {
        (None, None) => "-".into(),
        (e, i) => format!(
            "{}/{}",
            e.map_or("-".into(), |v| si(v as f64)),
            i.map_or("-".into(), |v| si(v as f64))
        ),
    }
}

const HEAD: [&str; 9] = [
    "PIPE",
    "RX pkt/s",
    "RX bit/s",
    "TX pkt/s",
    "TX bit/s",
    "DROP/s",
    "DROPS",
    "LIMIT e/i",
    "FC",
];

fn row(p: &PipeRates) -> [String; 9] {
    [
        p.pipe.clone(),
        si(p.rx_pps),
        si(p.rx_bps),
        si(p.tx_pps),
        si(p.tx_bps),
        si(p.drops_per_s),
        p.drops_total.to_string(),
        limit(p.egress_limit_bps, p.ingress_limit_bps),
        p.fast_channels.to_string(),
    ]
}

fn master_line(m: &MasterRates) -> String {
    format!(
        "master {}: {:>5.1}% busy {:>5.1}% idle {:>5.1}% asleep  {} frames/s  {} pipes",
        m.master,
        m.busy_pct,
        m.idle_pct,
        m.asleep_pct,
        si(m.frames_per_s),
        m.pipes
    )
}

fn print_sample(s: &Sample) {
    for m in &s.masters {
        println!("{}", master_line(m));
    }
    println!(
        "forwarded {} frames/s, {} pipes, {} captures",
        si(s.forwarded_per_s),
        s.pipes.len(),
        s.captures
    );
    println!(
        "{:<20} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>15} {:>3}",
        HEAD[0], HEAD[1], HEAD[2], HEAD[3], HEAD[4], HEAD[5], HEAD[6], HEAD[7], HEAD[8]
    );
    for p in &s.pipes {
        let r = row(p);
        println!(
            "{:<20} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>15} {:>3}",
            r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8]
        );
    }
}

fn interval(a: &TopArgs) -> Result<Duration> {
    if !(0.1..=3600.0).contains(&a.interval) {
        bail!("--interval takes 0.1 to 3600 seconds");
    }
    Ok(Duration::from_secs_f64(a.interval))
}

/// `docknet top`.
pub fn top(socket: &Path, a: TopArgs) -> Result<()> {
    let every = interval(&a)?;
    let mut c = Client::connect(socket)?;
    if a.once {
        let first = c.stats()?;
        std::thread::sleep(every);
        let s = rates(&first, &c.stats()?, a.sort);
        if a.json {
            println!("{}", serde_json::to_string_pretty(&s)?);
        } else {
            print_sample(&s);
        }
        return Ok(());
    }
    tui(c, every, a.sort)
}

fn tui(mut c: Client, every: Duration, mut sort: SortBy) -> Result<()> {
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    use ratatui::layout::{Constraint, Layout};
    use ratatui::style::{Modifier, Style};
    use ratatui::widgets::{Block, Gauge, Paragraph, Row, Table};

    let mut last = c.stats()?;
    let mut sample = rates(&last, &last, sort);
    let mut terminal = ratatui::init();
    let r = (|| -> Result<()> {
        let mut next = std::time::Instant::now() + every;
        loop {
            terminal.draw(|f| {
                let masters = sample.masters.len() as u16;
                let [head, gauges, table] = Layout::vertical([
                    Constraint::Length(1),
                    Constraint::Length(masters.max(1)),
                    Constraint::Min(3),
                ])
                .areas(f.area());
                f.render_widget(
                    Paragraph::new(format!(
                        "docknet top — {} pipes, {} frames/s forwarded, {} captures — sorted by {:?} (s: change, q: quit)",
                        sample.pipes.len(),
                        si(sample.forwarded_per_s),
                        sample.captures,
                        sort
                    )),
                    head,
                );
                let rows = Layout::vertical(vec![Constraint::Length(1); sample.masters.len()])
                    .split(gauges);
                for (m, area) in sample.masters.iter().zip(rows.iter()) {
                    f.render_widget(
                        Gauge::default()
                            .ratio((m.busy_pct / 100.0).clamp(0.0, 1.0))
                            .label(master_line(m)),
                        *area,
                    );
                }
                let widths = [
                    Constraint::Min(16),
                    Constraint::Length(9),
                    Constraint::Length(9),
                    Constraint::Length(9),
                    Constraint::Length(9),
                    Constraint::Length(8),
                    Constraint::Length(9),
                    Constraint::Length(15),
                    Constraint::Length(3),
                ];
                let t = Table::new(sample.pipes.iter().map(|p| Row::new(row(p))), widths)
                    .header(Row::new(HEAD).style(Style::default().add_modifier(Modifier::BOLD)))
                    .block(Block::bordered());
                f.render_widget(t, table);
            })?;
            let wait = next.saturating_duration_since(std::time::Instant::now());
            if event::poll(wait)? {
                if let Event::Key(k) = event::read()? {
                    if k.kind == KeyEventKind::Press {
                        match k.code {
                            KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                                return Ok(())
                            }
                            KeyCode::Char('s') => {
                                sort = sort.next();
                                sort_pipes(&mut sample.pipes, sort);
                            }
                            _ => {}
                        }
                    }
                }
                continue;
            }
            next = std::time::Instant::now() + every;
            let now = c.stats()?;
            sample = rates(&last, &now, sort);
            last = now;
        }
    })();
    ratatui::restore();
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use docknet_daemon::proto::{MasterLoad, PipeInfo};

    fn pipe(name: &str, rx: u64, drops: u64) -> PipeInfo {
        PipeInfo {
            name: name.into(),
            ip: "10.0.0.2/24".into(),
            ip6: None,
            mac: String::new(),
            mtu: 1500,
            ring_depth: 256,
            frame_size: 2048,
            region_bytes: 0,
            socket: None,
            connections: 1,
            fast_channels: Vec::new(),
            labels: BTreeMap::new(),
            counters: Some(
                [
                    ("rx_packets".to_string(), rx),
                    ("rx_bytes".to_string(), rx * 100),
                    ("drop_rx_full".to_string(), drops),
                ]
                .into_iter()
                .collect(),
            ),
        }
    }

    #[test]
    fn rates_are_differences_over_the_interval_and_sorting_follows() {
        let a = Stats {
            at_ns: 0,
            pipes: vec![pipe("a", 0, 0), pipe("b", 0, 0)],
            masters: vec![MasterLoad::default()],
            ..Stats::default()
        };
        let b = Stats {
            at_ns: 2_000_000_000,
            pipes: vec![pipe("a", 100, 10), pipe("b", 1000, 0)],
            masters: vec![MasterLoad {
                busy_ns: 500_000_000,
                asleep_ns: 1_500_000_000,
                frames: 1100,
                ..MasterLoad::default()
            }],
            forwarded: 1100,
            ..Stats::default()
        };
        let s = rates(&a, &b, SortBy::Traffic);
        assert_eq!(s.pipes[0].pipe, "b");
        assert_eq!(s.pipes[0].rx_pps, 500.0);
        assert_eq!(s.pipes[0].rx_bps, 500.0 * 800.0);
        assert_eq!(s.pipes[1].drops_per_s, 5.0);
        assert_eq!(s.masters[0].busy_pct, 25.0);
        assert_eq!(s.masters[0].asleep_pct, 75.0);
        let s = rates(&a, &b, SortBy::Drops);
        assert_eq!(s.pipes[0].pipe, "a");
        // counters that went backwards (a daemon restarted) read as no traffic, not as a
        // negative or huge rate
        let s = rates(&b, &a, SortBy::Name);
        assert!(s
            .pipes
            .iter()
            .all(|p| p.rx_pps == 0.0 && p.drops_per_s == 0.0));
        assert_eq!(si(1_234_567.0), "1.23M");
        assert_eq!(limit(Some(1_000_000), None), "1.00M/-");
    }
}
