//! What a long run says on stderr while it works: a line for each phase, and, where stderr is
//! not a terminal (a log file, a batch job), a line of progress every few seconds in place of
//! the run loop's progress bar, so that a run redirected to a file is never silent for long.
//!
//! Off by default: a library user's program prints nothing. `fit` turns it on for its own
//! duration from [`crate::FitConfig::progress`] ([`Lines::enable`]); a command line turns it on
//! for the whole process.

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Seconds between two progress lines where stderr is not a terminal, unless the environment
/// variable `PARVI_PROGRESS_EVERY` gives another number of seconds (a log that wants fewer).
pub const LINE_EVERY: Duration = Duration::from_secs(5);

/// [`LINE_EVERY`], or `PARVI_PROGRESS_EVERY` seconds where it is set to a number.
fn line_every() -> Duration {
    static EVERY: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *EVERY.get_or_init(|| {
        std::env::var("PARVI_PROGRESS_EVERY")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map_or(LINE_EVERY, Duration::from_secs_f64)
    })
}

static ENABLED: AtomicBool = AtomicBool::new(false);

/// The process's switch for phase and progress lines.
#[derive(Debug)]
pub struct Lines {
    previous: bool,
}

impl Lines {
    /// Turns the lines on (or off) until the returned guard is dropped, which restores the
    /// switch as it was.
    pub fn enable(on: bool) -> Self {
        Self { previous: ENABLED.swap(on, Ordering::Relaxed) }
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        ENABLED.store(self.previous, Ordering::Relaxed);
    }
}

/// Whether phase and progress lines are on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Prints `what` as a phase line (`parvi: <what>`) on stderr, where lines are on.
pub fn phase(what: &str) {
    if enabled() {
        eprintln!("parvi: {what}");
    }
}

/// A long loop's timed progress lines: [`Ticker::tick`] prints at most one line every
/// [`LINE_EVERY`] (`PARVI_PROGRESS_EVERY`), only where lines are on and stderr is not a terminal (a terminal has the
/// progress bar, or needs none).
#[derive(Debug)]
pub struct Ticker {
    label: String,
    started: Instant,
    last: Instant,
    on: bool,
}

impl Ticker {
    /// A ticker for the loop called `label`.
    pub fn new(label: impl Into<String>) -> Self {
        let now = Instant::now();
        Self { label: label.into(), started: now, last: now, on: enabled() && !std::io::stderr().is_terminal() }
    }

    /// Prints `label: <status>, <seconds> s` when the last line is [`LINE_EVERY`] old; `status`
    /// is only built then.
    pub fn tick(&mut self, status: impl FnOnce() -> String) {
        if self.on && self.last.elapsed() >= line_every() {
            self.last = Instant::now();
            eprintln!("parvi: {}: {}, {:.0} s", self.label, status(), self.started.elapsed().as_secs_f64());
        }
    }
}
