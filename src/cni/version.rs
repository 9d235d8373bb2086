//! CNI specification versions: which ones the crate speaks, which commands
//! each one has, and VERSION's result.

use serde_json::json;

use super::command::Command;
use super::error::Error;

/// The spec versions a configuration may name, oldest first. 0.1.0 and
/// 0.2.0 have no `prevResult`, so no stack of delegates can work there.
pub const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The newest supported version: what an error reply carries when the
/// input's own version could not be read.
pub const NEWEST: &str = SUPPORTED[SUPPORTED.len() - 1];

/// The supported version equal to `version`, if the plugin speaks it.
pub fn supported(version: &str) -> Option<&'static str> {
    SUPPORTED.iter().find(|v| **v == version).copied()
}

/// Refuses a command that the configuration's (supported) version does not have.
pub fn check_command(command: Command, version: &'static str) -> Result<(), Error> {
    let minimum = match command {
        Command::Check => "0.4.0",
        Command::Gc | Command::Status => "1.1.0",
        Command::Add | Command::Del | Command::Version => return Ok(()),
    };
    if position(version) >= position(minimum) {
        Ok(())
    } else {
        Err(Error::CommandNeedsVersion {
            command,
            minimum,
            version,
        })
    }
}

/// Order within SUPPORTED; only ever asked of supported versions.
fn position(version: &str) -> Option<usize> {
    SUPPORTED.iter().position(|v| *v == version)
}

/// VERSION's result: the versions the crate speaks, and the cniVersion
/// asked with, echoed.
pub fn version_result(cni_version: &str) -> Vec<u8> {
    let mut bytes = json!({"cniVersion": cni_version, "supportedVersions": SUPPORTED})
        .to_string()
        .into_bytes();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::code;
    use crate::cni::Reportable;

    #[test]
    fn every_listed_version_is_supported_and_nothing_else() {
        for v in SUPPORTED {
            assert_eq!(supported(v), Some(v));
        }
        for v in ["0.1.0", "0.2.0", "1.2.0", "", "1.0", " 1.0.0"] {
            assert_eq!(supported(v), None, "{v:?}");
        }
    }

    #[test]
    fn check_needs_0_4_0() {
        for v in ["0.3.0", "0.3.1"] {
            let e = check_command(Command::Check, v).unwrap_err();
            assert_eq!(e.code(), code::INCOMPATIBLE_VERSION);
            assert_eq!(
                e.to_string(),
                format!("CHECK needs cniVersion 0.4.0 or later, the configuration has {v}")
            );
        }
        for v in ["0.4.0", "1.0.0", "1.1.0"] {
            assert!(check_command(Command::Check, v).is_ok());
        }
    }

    #[test]
    fn gc_and_status_need_1_1_0() {
        for command in [Command::Gc, Command::Status] {
            for v in ["0.3.0", "0.3.1", "0.4.0", "1.0.0"] {
                let e = check_command(command, v).unwrap_err();
                assert_eq!(e.code(), code::INCOMPATIBLE_VERSION);
                assert_eq!(
                    e.to_string(),
                    format!("{command} needs cniVersion 1.1.0 or later, the configuration has {v}")
                );
            }
            assert!(check_command(command, "1.1.0").is_ok());
        }
    }

    #[test]
    fn add_and_del_work_at_every_version() {
        for v in SUPPORTED {
            assert!(check_command(Command::Add, v).is_ok());
            assert!(check_command(Command::Del, v).is_ok());
        }
    }

    #[test]
    fn the_version_result_echoes_and_lists() {
        let v: serde_json::Value = serde_json::from_slice(&version_result("0.4.0")).unwrap();
        assert_eq!(
            v,
            json!({"cniVersion": "0.4.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
        );
    }
}
