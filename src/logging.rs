//! Logging: warnings and errors to stderr, one line each, always; with the
//! `verbose` feature, everything from debug up appended to a log file too.

use std::io::{self, Write};

use tracing::Level;
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};

/// Where the `verbose` flavour appends its log.
pub const LOG_FILE: &str = "/var/log/cni/ipam-delegated.log";

/// Overrides [`LOG_FILE`] (for a runtime whose /var/log is read-only, and for tests).
pub const LOG_FILE_VARIABLE: &str = "IPAM_DELEGATED_LOG_FILE";

/// Installs the global subscriber. Every event is written as it happens,
/// with no background worker, so the log is complete whenever the process
/// exits, whichever way it exits.
pub fn init() {
    let stderr = (|| OneLine(io::stderr())).with_max_level(Level::WARN);
    let (writer, level) = if cfg!(feature = "verbose") {
        match open_log_file() {
            Ok(file) => (BoxMakeWriter::new(stderr.and(file)), Level::DEBUG),
            Err(e) => {
                let _ = writeln!(
                    io::stderr(),
                    "ipam-delegated: cannot open the log file, logging to stderr only: {e}"
                );
                (BoxMakeWriter::new(stderr), Level::WARN)
            }
        }
    } else {
        (BoxMakeWriter::new(stderr), Level::WARN)
    };
    tracing_subscriber::fmt()
        // A log that cannot be written must never stop the reply; the
        // default would report on stderr, panicking when that is closed too.
        .log_internal_errors(false)
        .with_ansi(false)
        .with_max_level(level)
        .with_writer(writer)
        .init();
}

/// Opens the log for appending, so that concurrent invocations each add
/// whole lines and none truncates another's.
fn open_log_file() -> std::io::Result<std::fs::File> {
    let path = std::env::var_os(LOG_FILE_VARIABLE)
        .filter(|p| !p.is_empty())
        .map_or_else(|| LOG_FILE.into(), std::path::PathBuf::from);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Keeps each event on one line of stderr, whatever a delegate put in its
/// message: the formatter hands over one whole event per write, and every
/// newline but the last becomes a visible `\n`.
struct OneLine<W>(W);

impl<W: Write> Write for OneLine<W> {
    fn write(&mut self, event: &[u8]) -> io::Result<usize> {
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
        // A closed stderr loses the line and nothing else.
        let _ = self.0.write_all(&line);
        Ok(event.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_line(event: &[u8]) -> Vec<u8> {
        let mut out = OneLine(Vec::new());
        assert_eq!(out.write(event).unwrap(), event.len());
        out.0
    }

    #[test]
    fn interior_newlines_become_visible_escapes() {
        assert_eq!(one_line(b"a\nb\r\nc\n"), b"a\\nb\\r\\nc\n");
        assert_eq!(one_line(b"plain\n"), b"plain\n");
        assert_eq!(one_line(b"no end"), b"no end");
    }
}
