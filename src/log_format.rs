//! The fields of a text log line, written as tracing-subscriber's `DefaultFields` writes them
//! (`message k=v k="text" …`) but straight into a reused buffer: its visitor goes through
//! `core::fmt` and its styling wrappers once per field, and the per-request summary line has
//! seventeen fields (5% of a proxied request's instructions under callgrind, issue 16).
//!
//! Only what is plain takes this path: no ANSI colour, messages and strings of printable ASCII,
//! no error values. Anything else (and a re-entrant call) is handed to `DefaultFields` whole, so
//! a line reads exactly as it did; a test holds the two to the same output.

use std::cell::RefCell;
use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::FormatFields;

/// The field formatter for `tracing_subscriber::fmt().fmt_fields(...)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fields;

thread_local! {
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
}

impl<'w> FormatFields<'w> for Fields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        if !writer.has_ansi_escapes() {
            let written = LINE.with(|line| {
                let mut line = line.try_borrow_mut().ok()?;
                line.clear();
                let mut plain = Plain { out: &mut line, first: true, plain: true };
                fields.record(&mut plain);
                plain.plain.then(|| writer.write_str(&line))
            });
            if let Some(result) = written {
                return result;
            }
        }
        DefaultFields::new().format_fields(writer, fields)
    }
}

/// The time at the head of a line, as tracing-subscriber's `SystemTime` writes it
/// (`2026-12-06T21:22:50.123456Z`, UTC), with the date and time of day made once a second per
/// thread instead of per line: its calendar arithmetic and seven `core::fmt` writes were a
/// quarter of the summary line's cost (callgrind, issue 16). Outside years 0-9999 (a clock set
/// far off) the line goes to `SystemTime` itself.
#[derive(Debug, Default, Clone, Copy)]
pub struct Clock;

thread_local! {
    /// The second last written and its text (`YYYY-MM-DDTHH:MM:SS`).
    static SECOND: RefCell<(i64, String)> = const { RefCell::new((i64::MIN, String::new())) };
}

impl FormatTime for Clock {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let Some((secs, micros)) = since.ok().and_then(|d| Some((i64::try_from(d.as_secs()).ok()?, d.subsec_micros())))
        else {
            return tracing_subscriber::fmt::time::SystemTime.format_time(w);
        };
        let written = SECOND.with(|cell| {
            let mut cached = cell.try_borrow_mut().ok()?;
            if cached.0 != secs {
                cached.1 = second_text(secs)?;
                cached.0 = secs;
            }
            let mut tail = *b".000000Z";
            let mut n = micros;
            for digit in tail[1..7].iter_mut().rev() {
                *digit = b'0' + (n % 10) as u8;
                n /= 10;
            }
            let tail = std::str::from_utf8(&tail).ok()?;
            Some(w.write_str(&cached.1).and_then(|()| w.write_str(tail)))
        });
        written.unwrap_or_else(|| tracing_subscriber::fmt::time::SystemTime.format_time(w))
    }
}

/// `secs` after the epoch as `YYYY-MM-DDTHH:MM:SS` (UTC), for years 0 to 9999.
fn second_text(secs: i64) -> Option<String> {
    let t = time::OffsetDateTime::from_unix_timestamp(secs).ok()?;
    (0..=9999).contains(&t.year()).then(|| {
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        )
    })
}

/// Writes each field as `DefaultVisitor` would without colour; `plain` turns false at the
/// first field it cannot write that way.
struct Plain<'a> {
    out: &'a mut String,
    first: bool,
    plain: bool,
}

/// Text a terminal shows as it is: printable ASCII.
fn printable(s: &str) -> bool {
    s.bytes().all(|b| (0x20..0x7f).contains(&b))
}

impl Plain<'_> {
    /// The separator and `name=`; `false` for the fields `DefaultVisitor` skips (`log.*`,
    /// already in the line's head).
    fn name(&mut self, field: &Field) -> bool {
        let name = field.name();
        if name.starts_with("log.") {
            return false;
        }
        if !self.first {
            self.out.push(' ');
        }
        self.first = false;
        if name != "message" {
            self.out.push_str(name.strip_prefix("r#").unwrap_or(name));
            self.out.push('=');
        }
        true
    }
}

/// `n` in decimal, as `Display` writes it, without `core::fmt` (itoa): the summary line has
/// nine numbers, and formatting each through `write!` was a fifth of its fields' cost
/// (callgrind, issue 16).
fn push_decimal(out: &mut String, n: impl itoa::Integer) {
    out.push_str(itoa::Buffer::new().format(n));
}

impl Visit for Plain<'_> {
    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.plain && self.name(field) {
            push_decimal(self.out, value);
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.plain && self.name(field) {
            push_decimal(self.out, value);
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.plain && self.name(field) {
            self.out.push_str(if value { "true" } else { "false" });
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        // The message as it is; any other string quoted, as its `Debug` quotes it.
        let quoted = field.name() != "message";
        if !printable(value) || (quoted && value.contains(['"', '\\'])) {
            self.plain = false;
        }
        if self.plain && self.name(field) {
            if quoted {
                self.out.push('"');
                self.out.push_str(value);
                self.out.push('"');
            } else {
                self.out.push_str(value);
            }
        }
    }

    fn record_error(&mut self, _field: &Field, _value: &(dyn std::error::Error + 'static)) {
        self.plain = false;
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if !(self.plain && self.name(field)) {
            return;
        }
        let start = self.out.len();
        let _ = write!(self.out, "{value:?}");
        // A message is escaped by `DefaultVisitor` where it is not printable: left to it.
        if field.name() == "message" && !printable(&self.out[start..]) {
            self.plain = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// The lines each formatter writes for the same events, timestamps left out.
    fn lines(fast: bool, events: impl Fn()) -> String {
        let buffer = Buffer::default();
        let builder = tracing_subscriber::fmt().without_time().with_ansi(false).with_writer(buffer.clone());
        let subscriber: Box<dyn tracing::Subscriber + Send + Sync> = match fast {
            true => Box::new(builder.fmt_fields(Fields).finish()),
            false => Box::new(builder.finish()),
        };
        tracing::subscriber::with_default(subscriber, events);
        let bytes = buffer.0.lock().expect("buffer").clone();
        String::from_utf8(bytes).expect("utf-8")
    }

    #[test]
    fn numbers_are_written_as_display_writes_them() {
        for n in [0, 1, 9, 10, 99, 100, 4_294_967_296, u64::MAX / 10, u64::MAX - 1, u64::MAX] {
            let mut out = String::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string());
        }
        let lines = |fast| {
            lines(fast, || {
                tracing::info!(a = 0i64, b = -1i64, c = i64::MIN, d = i64::MAX, e = u64::MAX, f = 42u64, "numbers");
            })
        };
        assert_eq!(lines(true), lines(false));
        assert!(lines(true).contains("c=-9223372036854775808 d=9223372036854775807 e=18446744073709551615"));
    }

    #[test]
    fn lines_read_as_the_default_formatter_writes_them() {
        let events = || {
            let (id, model) = ("0192-abc", "llama3.2");
            tracing::info!(target: "corral::request", id = %id, model = %model, node = "n0", attempts = 1u32,
                status = %"ok", http_status = 200u16, error_code = "", queued_ms = 0i64, total_ms = -3i64,
                streamed = false, interrupted = true, "request finished");
            tracing::warn!(share = 0.5f64, r#type = "x", "cloud providers are answering a large share of requests");
            tracing::info!(node = "say \"hi\"\\", model = "ünïcode", "quoted and escaped");
            tracing::info!("a message with an escape \u{1b}[31m and a bell \u{7}");
            tracing::info!(why = %"line\nbreak", "display text is written as it is");
            tracing::error!(error = &std::io::Error::other("boom") as &(dyn std::error::Error + 'static), "failed");
            tracing::info!(count = 3, "{} formatted {}", "message", 7);
            tracing::info!(only = 1u64);
        };
        let (fast, default) = (lines(true, events), lines(false, events));
        assert_eq!(fast, default);
        assert!(fast.contains("request finished id=0192-abc model=llama3.2 node=\"n0\" attempts=1"), "{fast}");
        assert_eq!(fast.lines().count(), 9, "one field's text breaks its line, as before: {fast}");
    }

    #[test]
    fn the_request_line_takes_the_plain_path() {
        let _ = lines(true, || {
            tracing::info!(target: "corral::request", id = %"0192", node = "n0", attempts = 1i64, streamed = false, "request finished");
        });
        let line = LINE.with(|l| l.borrow().clone());
        assert_eq!(line, "request finished id=0192 node=\"n0\" attempts=1 streamed=false", "written by this visitor");
    }

    #[test]
    fn seconds_read_as_the_calendar_says() {
        assert_eq!(second_text(0).as_deref(), Some("1970-01-01T00:00:00"));
        assert_eq!(second_text(951_782_400).as_deref(), Some("2000-02-29T00:00:00"), "a leap day");
        assert_eq!(second_text(1_796_601_599).as_deref(), Some("2026-12-06T23:59:59"));
        assert_eq!(second_text(253_402_300_799).as_deref(), Some("9999-12-31T23:59:59"));
        assert_eq!(second_text(253_402_300_800), None, "year 10000 is left to SystemTime");
        assert_eq!(second_text(-62_167_219_200).as_deref(), Some("0000-01-01T00:00:00"));
        assert_eq!(second_text(-62_167_219_201), None, "before year 0 too");
    }

    /// The clock writes what tracing-subscriber's `SystemTime` writes, to the second (and the
    /// microseconds in its shape), also after the second turns over.
    #[test]
    fn the_clock_writes_as_system_time_does() {
        let text = |f: &dyn FormatTime| {
            let mut s = String::new();
            f.format_time(&mut Writer::new(&mut s)).expect("format");
            s
        };
        let seconds = |s: &str| s[..19].to_string();
        let mut compared = 0;
        let mut last = String::new();
        // Until two different seconds are compared, bounded: the loop spins a few seconds at most.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while compared < 2 && tokio::time::Instant::now() < deadline {
            let (before, theirs, after) =
                (text(&Clock), text(&tracing_subscriber::fmt::time::SystemTime), text(&Clock));
            assert_eq!((before.len(), after.len()), (theirs.len(), theirs.len()), "{before} / {theirs}");
            assert!(after.ends_with('Z') && after.as_bytes()[19] == b'.', "{after}");
            assert!(after[20..26].bytes().all(|b| b.is_ascii_digit()), "{after}");
            assert!(before <= after, "{before} then {after}");
            if seconds(&before) == seconds(&after) {
                assert_eq!(seconds(&before), seconds(&theirs));
                if seconds(&before) != last {
                    last = seconds(&before);
                    compared += 1;
                }
            }
        }
        assert_eq!(compared, 2, "two seconds compared");
    }
}
