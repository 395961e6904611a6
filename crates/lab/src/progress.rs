//! Progress over a sweep: a bar on a terminal, one line per point in a log.

use std::io::IsTerminal;

/// Progress of a run of `total` points.
#[derive(Debug)]
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: u64,
    done: u64,
}

impl Progress {
    /// Progress over `total` points.
    pub fn new(total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:30.cyan/blue} {pos}/{len} points, {elapsed} (eta {eta}) {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        });
        Progress {
            bar,
            total,
            done: 0,
        }
    }

    /// Says what is being measured now (on the bar only).
    pub fn start(&self, what: &str) {
        if let Some(b) = &self.bar {
            b.set_message(what.to_string());
        }
    }

    /// A line that is not a point (a mode left out, a warning).
    pub fn line(&self, s: &str) {
        match &self.bar {
            Some(b) => b.println(s),
            None => eprintln!("{s}"),
        }
    }

    /// One point done, with its result in a line.
    pub fn done(&mut self, s: &str) {
        self.done += 1;
        match &self.bar {
            Some(b) => {
                b.inc(1);
                b.println(s);
            }
            None => eprintln!("[{}/{}] {s}", self.done, self.total),
        }
    }

    /// `n` points that will not run (their mode failed).
    pub fn skip(&mut self, n: u64) {
        self.done += n;
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
