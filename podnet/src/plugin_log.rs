//! The log sink of a CNI plugin call: warnings and errors, one line each, on
//! stderr (stdout belongs to the CNI protocol).
//!
//! A plugin process lives a few milliseconds, and `tracing_subscriber`'s
//! registry allocates its span slab up front, which costs page faults on
//! every call for spans a plugin never opens. This subscriber keeps no span
//! state at all. `PODNET_LOG` still selects the full subscriber with filters.

use std::fmt::Write as _;
use std::io::Write as _;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Prints events at WARN and above to stderr.
pub struct Stderr;

struct Line(String);

impl Visit for Line {
    fn record_str(&mut self, f: &Field, v: &str) {
        if f.name() == "message" {
            let _ = write!(self.0, " {v}");
        } else {
            let _ = write!(self.0, " {}={v:?}", f.name());
        }
    }

    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        if f.name() == "message" {
            let _ = write!(self.0, " {v:?}");
        } else {
            let _ = write!(self.0, " {}={v:?}", f.name());
        }
    }
}

impl Subscriber for Stderr {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        *m.level() <= Level::WARN
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::WARN)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, e: &Event<'_>) {
        let m = e.metadata();
        let mut line = Line(format!("{} {}:", m.level(), m.target()));
        e.record(&mut line);
        line.0.push('\n');
        let _ = std::io::stderr().write_all(line.0.as_bytes());
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
