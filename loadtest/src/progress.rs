//! The progress bar on the terminal (nothing when stderr is not a terminal or `--quiet`), and
//! the harness's messages above it.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A shared handle to the bar.
#[derive(Clone)]
pub struct Progress {
    bar: ProgressBar,
    quiet: bool,
}

impl Progress {
    pub fn new(quiet: bool) -> Self {
        let bar = if quiet {
            ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden())
        } else {
            ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr())
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30.cyan/blue} {pos:>5}/{len:5} s  {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Self { bar, quiet }
    }

    /// A line above the bar (stderr).
    pub fn say(&self, message: impl AsRef<str>) {
        if self.quiet {
            return;
        }
        if self.bar.is_hidden() {
            eprintln!("loadtest: {}", message.as_ref());
        } else {
            self.bar.println(format!("loadtest: {}", message.as_ref()));
        }
    }

    /// Seconds the current phase is expected to take.
    pub fn expect(&self, seconds: u64) {
        self.bar.set_length(seconds);
        self.bar.set_position(0);
    }

    /// Seconds done and the figures of the moment.
    pub fn update(&self, seconds: u64, message: String) {
        self.bar.set_position(seconds);
        self.bar.set_message(message);
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
