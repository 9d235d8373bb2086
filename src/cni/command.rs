//! The commands a runtime can send in CNI_COMMAND.

use std::fmt;

/// A command of the CNI specification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Allocate.
    Add,
    /// Release; repeated, and for what may never have been added.
    Del,
    /// Verify what an ADD made (0.4.0 and later).
    Check,
    /// Release what the runtime no longer knows of (1.1.0).
    Gc,
    /// Say whether an ADD could succeed now (1.1.0).
    Status,
    /// Report the spec versions the plugin speaks.
    Version,
}

impl Command {
    /// The command's name as it appears in CNI_COMMAND.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Gc => "GC",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
        }
    }

    /// The command named `name`, if there is one.
    pub fn parse(name: &str) -> Option<Command> {
        Some(match name {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
