//! Logging, for every plugin binary of the crate: warnings and errors to
//! stderr, one line each, always; with the `verbose` feature, everything
//! from debug up appended to a log file too (`/var/log/cni/PROGRAM.log`).

use std::fmt::{self, Write as _};
use std::io::{self, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// Installs the global subscriber for `program`, the name each line
/// carries. Every event is written as it happens, with no background
/// worker, so the log is complete whenever the process exits, whichever
/// way it exits.
pub fn init(program: &'static str) {
    #[cfg(feature = "verbose")]
    if verbose::init(program) {
        return;
    }
    let _ = tracing::subscriber::set_global_default(Stderr(program));
}

/// The most detailed level stderr gets: warnings for a plugin, which
/// most runs never write; information too for a long-running service.
static STDERR_LEVEL: AtomicUsize = AtomicUsize::new(WARN);

const WARN: usize = 0;
const INFO: usize = 1;

/// For a long-running service (the Docker driver): stderr gets
/// information too, one line for each thing the service did.
pub fn for_service() {
    STDERR_LEVEL.store(INFO, Ordering::Relaxed);
    tracing::callsite::rebuild_interest_cache();
}

/// The most detailed level stderr gets now.
fn stderr_level() -> Level {
    match STDERR_LEVEL.load(Ordering::Relaxed) {
        WARN => Level::WARN,
        _ => Level::INFO,
    }
}

/// The standard flavour's subscriber (and the verbose one's fallback):
/// each warning or error as one line on stderr, and nothing else is even
/// formatted. It keeps no state, so setting it up costs nothing: most runs
/// log nothing at all, and every pod start pays for the plugin's start-up.
struct Stderr(&'static str);

impl Subscriber for Stderr {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.enabled(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= stderr_level()
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::from_level(
            stderr_level(),
        ))
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // Spans carry nothing this subscriber shows.
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let metadata = event.metadata();
        let mut line = Line(format!(
            "{}[{}]: {} {}:",
            self.0,
            std::process::id(),
            metadata.level(),
            metadata.target()
        ));
        event.record(&mut line);
        line.0.push('\n');
        // A closed stderr loses the line and nothing else.
        let _ = io::stderr().write_all(&one_line(line.0.as_bytes()));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// An event's fields as text: the message, then `name=value` for each other.
struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let _ = if field.name() == "message" {
            write!(self.0, " {value:?}")
        } else {
            write!(self.0, " {}={value:?}", field.name())
        };
    }
}

/// Every newline but a last one as a visible `\n` (and `\r` alike), so
/// that an event stays one line whatever a delegate put in its message.
fn one_line(event: &[u8]) -> Vec<u8> {
    let (body, end) = match event.strip_suffix(b"\n") {
        Some(body) => (body, &b"\n"[..]),
        None => (event, &b""[..]),
    };
    let mut line = Vec::with_capacity(event.len() + 8);
    for &byte in body {
        match byte {
            b'\n' => line.extend_from_slice(b"\\n"),
            b'\r' => line.extend_from_slice(b"\\r"),
            _ => line.push(byte),
        }
    }
    line.extend_from_slice(end);
    line
}

/// The verbose flavour: tracing-subscriber's formatter, writing warnings
/// and errors to stderr and everything from debug up to the log file.
#[cfg(feature = "verbose")]
mod verbose {
    use std::io::{self, Write};
    use std::os::unix::fs::OpenOptionsExt;

    use tracing::Level;
    use tracing_subscriber::fmt::writer::MakeWriterExt;

    use super::one_line;

    /// Where the logs are appended, each program's to its own file.
    const LOG_DIR: &str = "/var/log/cni";

    /// Overrides the log file, for every program of the crate (for a
    /// runtime whose /var/log is read-only, and for tests).
    const LOG_FILE_VARIABLE: &str = "IPAM_DELEGATED_LOG_FILE";

    /// Installs it; false (after saying why) if the log file cannot be opened.
    pub(super) fn init(program: &str) -> bool {
        let file = match open_log_file(program) {
            Ok(file) => file,
            Err(e) => {
                let _ = writeln!(
                    io::stderr(),
                    "{program}: cannot open the log file, logging to stderr only: {e}"
                );
                return false;
            }
        };
        let stderr = (|| OneLine(io::stderr()))
            .with_filter(|metadata: &tracing::Metadata| *metadata.level() <= super::stderr_level());
        tracing_subscriber::fmt()
            // A log that cannot be written must never stop the reply; the
            // default would report on stderr, panicking when that is closed too.
            .log_internal_errors(false)
            .with_ansi(false)
            .with_max_level(Level::DEBUG)
            .with_writer(stderr.and(file))
            .init();
        true
    }

    /// Opens the log for appending, so that concurrent invocations each add
    /// whole lines and none truncates another's.
    fn open_log_file(program: &str) -> io::Result<std::fs::File> {
        let path = std::env::var_os(LOG_FILE_VARIABLE)
            .filter(|p| !p.is_empty())
            .map_or_else(
                || std::path::Path::new(LOG_DIR).join(format!("{program}.log")),
                std::path::PathBuf::from,
            );
        if let Some(dir) = path.parent() {
            crate::dir::make_all(dir, crate::dir::SHARED_DIR)?;
        }
        // As the runtime's other logs: root writes, others may read.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o644)
            .open(path)
    }

    /// Keeps each event on one line of stderr: the formatter hands over one
    /// whole event per write.
    struct OneLine<W>(W);

    impl<W: Write> Write for OneLine<W> {
        fn write(&mut self, event: &[u8]) -> io::Result<usize> {
            // A closed stderr loses the line and nothing else.
            let _ = self.0.write_all(&one_line(event));
            Ok(event.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            self.0.flush()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interior_newlines_become_visible_escapes() {
        assert_eq!(one_line(b"a\nb\r\nc\n"), b"a\\nb\\r\\nc\n");
        assert_eq!(one_line(b"plain\n"), b"plain\n");
        assert_eq!(one_line(b"no end"), b"no end");
    }

    #[test]
    fn an_event_is_the_message_then_its_fields() {
        let mut line = Line(String::from("x:"));
        let fields = tracing::field::FieldSet::new(
            &["message", "code", "details"],
            tracing::callsite::Identifier(&CALLSITE),
        );
        let mut names = fields.iter();
        let (message, code, details) = (
            names.next().unwrap(),
            names.next().unwrap(),
            names.next().unwrap(),
        );
        line.record_debug(&message, &format_args!("it failed"));
        line.record_debug(&code, &11);
        line.record_debug(&details, &"two\nlines");
        assert_eq!(line.0, "x: it failed code=11 details=\"two\\nlines\"");
    }

    struct Callsite;
    static CALLSITE: Callsite = Callsite;
    impl tracing::callsite::Callsite for Callsite {
        fn set_interest(&self, _: Interest) {}
        fn metadata(&self) -> &Metadata<'_> {
            unimplemented!("not asked in these tests")
        }
    }
}
