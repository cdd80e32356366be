//! Where the binary's log lines go: a buffer in memory that one thread writes out to stderr
//! within [`LINGER`] of its first line, so the request path never waits on a slow terminal or
//! pipe and a busy broker makes one `write` per linger, not one per request.
//!
//! tracing-appender's non-blocking writer (what this replaced) sends each line through a
//! channel to its thread: one allocation, one futex wake of that thread and one `write` per
//! line, a measurable share of a request's CPU at thousands of requests a second (issue 16).
//! Here a line is copied into the buffer under a lock that is free nearly always; only the
//! first line into an empty buffer wakes the thread.
//!
//! Not lossy: past [`MAX_HELD`] bytes waiting (stderr not keeping up), a line waits for room
//! rather than being dropped. Dropping the [`Flush`] guard writes what is held and stops the
//! thread; a process killed outright loses at most the last linger's lines.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How long the thread lets lines gather after the first before it writes them.
pub const LINGER: Duration = Duration::from_millis(20);
/// Most bytes held before a line waits for the thread to write.
const MAX_HELD: usize = 4 * 1024 * 1024;

#[derive(Default)]
struct Held {
    bytes: Vec<u8>,
    closed: bool,
}

#[derive(Default)]
struct Inner {
    held: Mutex<Held>,
    /// The thread waits here for a first line (or the close).
    wake: Condvar,
    /// Lines wait here for room.
    room: Condvar,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The writer handed to `tracing_subscriber::fmt().with_writer(...)`; cheap to clone.
#[derive(Clone)]
pub struct LogWriter {
    inner: Arc<Inner>,
}

/// Writes what is held and stops the thread when dropped.
pub struct Flush {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LogWriter {
    /// A writer to `out` (stderr in the binary) and the guard that flushes it.
    pub fn spawn(out: impl Write + Send + 'static) -> std::io::Result<(LogWriter, Flush)> {
        let inner = Arc::new(Inner::default());
        let thread = {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new().name("corral-log".into()).spawn(move || drain(&inner, out))?
        };
        Ok((LogWriter { inner: Arc::clone(&inner) }, Flush { inner, thread: Some(thread) }))
    }
}

/// The thread: wait for a first line, let more gather for [`LINGER`] (cut short by the close),
/// write them all, again until closed and empty.
fn drain(inner: &Inner, mut out: impl Write) {
    let mut spare = Vec::new();
    loop {
        let mut held = inner.lock();
        while held.bytes.is_empty() && !held.closed {
            held = inner.wake.wait(held).unwrap_or_else(|p| p.into_inner());
        }
        if held.bytes.is_empty() {
            return;
        }
        if !held.closed {
            held =
                inner.wake.wait_timeout_while(held, LINGER, |h| !h.closed).map_or_else(|p| p.into_inner().0, |r| r.0);
        }
        std::mem::swap(&mut held.bytes, &mut spare);
        drop(held);
        inner.room.notify_all();
        // Nowhere to report a failing stderr: the lines are let go, as any logger would.
        let _ = out.write_all(&spare).and_then(|()| out.flush());
        spare.clear();
    }
}

impl Drop for Flush {
    fn drop(&mut self) {
        self.inner.lock().closed = true;
        self.inner.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Write for LogWriter {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut held = self.inner.lock();
        while held.bytes.len() >= MAX_HELD && !held.closed {
            held = self.inner.room.wait(held).unwrap_or_else(|p| p.into_inner());
        }
        let first = held.bytes.is_empty();
        held.bytes.extend_from_slice(line);
        drop(held);
        if first {
            self.inner.wake.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `out` that records each `write_all` it is given, in order.
    #[derive(Clone, Default)]
    struct Writes(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Writes {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("writes").push(b.to_vec());
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_written_together_leave_in_one_write_and_in_order_and_the_guard_flushes() {
        let out = Writes::default();
        let (mut w, flush) = LogWriter::spawn(out.clone()).expect("thread");
        let lines: Vec<String> = (0..1000).map(|i| format!("line {i}\n")).collect();
        for l in &lines {
            w.write_all(l.as_bytes()).expect("write");
        }
        drop(flush);
        let writes = out.0.lock().expect("writes").clone();
        assert!(writes.len() <= 2, "a burst leaves in one or two writes, not {}", writes.len());
        assert_eq!(String::from_utf8(writes.concat()).expect("utf-8"), lines.concat(), "every line, in order");
    }

    #[test]
    fn a_full_buffer_makes_a_line_wait_for_room_not_drop() {
        // An `out` that takes each write only when the test lets it: the buffer fills behind it.
        let (go, gate) = std::sync::mpsc::sync_channel::<()>(0);
        struct Gated(std::sync::mpsc::Receiver<()>, Writes);
        impl Write for Gated {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let _ = self.0.recv();
                self.1.write(b)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let out = Writes::default();
        let (w, flush) = LogWriter::spawn(Gated(gate, out.clone())).expect("thread");
        let inner = Arc::clone(&w.inner);
        let chunk = vec![b'x'; 64 * 1024];
        let total = MAX_HELD * 3;
        let writer = std::thread::spawn(move || {
            let mut w = w;
            for _ in 0..total / chunk.len() {
                w.write_all(&chunk).expect("write");
            }
        });
        // With stderr stuck, the buffer fills to its bound and the writer waits there.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while inner.lock().bytes.len() < MAX_HELD && tokio::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(inner.lock().bytes.len(), MAX_HELD, "held up to the bound, not past it");
        assert!(!writer.is_finished(), "the writer waits for room");
        let releaser = std::thread::spawn(move || while go.send(()).is_ok() {});
        writer.join().expect("writer");
        drop(flush);
        releaser.join().expect("releaser");
        let written: usize = out.0.lock().expect("writes").iter().map(Vec::len).sum();
        assert_eq!(written, total, "nothing dropped");
    }
}
