//! What a delegate's exit status and stdout amount to: a result to pass
//! on, nothing, output to ignore, or a failure (its own CNI error object
//! kept, or one of the plugin's codes 100 to 104 naming what happened).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use serde_json::Value;

use crate::cni::{self, Command};
use crate::delegated::error::Failure;

/// How much of a delegate's stdout an error or a warning quotes.
const EXCERPT_LEN: usize = 512;

/// What a delegate that succeeded printed.
#[derive(Debug, PartialEq, Eq)]
pub enum Printed {
    /// One JSON object, surrounding whitespace trimmed, as printed.
    Object(Vec<u8>),
    /// Nothing but whitespace.
    Nothing,
    /// Something else, which only ADD must not print: libcni ignores
    /// stdout on success for the other commands, so this counts as
    /// nothing (and is worth a warning).
    Ignored {
        /// Why it is not one JSON object.
        reason: String,
        /// The start of it.
        stdout: String,
    },
}

/// Decides what `command`'s exit status and stdout amount to: on success,
/// what it printed; on failure, its CNI error object or what else went
/// wrong.
pub fn judge(command: Command, status: ExitStatus, stdout: Vec<u8>) -> Result<Printed, Failure> {
    let printed = trim(stdout);
    if status.success() {
        if printed.is_empty() {
            return Ok(Printed::Nothing);
        }
        // Checked without building the value: it is passed on as printed.
        return match cni::check_object(&printed) {
            Ok(()) => Ok(Printed::Object(printed)),
            Err(reason) if command != Command::Add => Ok(Printed::Ignored {
                reason,
                stdout: excerpt(&printed),
            }),
            Err(reason) => Err(Failure::NotObject {
                reason,
                stdout: excerpt(&printed),
            }),
        };
    }
    if let Some(signal) = status.signal() {
        return Err(Failure::Killed(signal));
    }
    Err(reported(&printed).unwrap_or_else(|| Failure::Exited {
        status: status.code().unwrap_or(-1),
        stdout: excerpt(&printed),
    }))
}

/// A CNI error object: a JSON object with a non-zero integer `code`; `msg`
/// and `details` are kept when they are strings.
fn reported(printed: &[u8]) -> Option<Failure> {
    let Value::Object(error) = serde_json::from_slice(printed).ok()? else {
        return None;
    };
    let code = error.get("code")?.as_u64().filter(|c| *c != 0)?;
    let text = |key| {
        error
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    Some(Failure::Reported {
        code: u32::try_from(code).ok()?,
        msg: text("msg"),
        details: text("details"),
    })
}

fn trim(mut bytes: Vec<u8>) -> Vec<u8> {
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    bytes.truncate(end);
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(0);
    bytes.drain(..start);
    bytes
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(EXCERPT_LEN)]);
    if bytes.len() > EXCERPT_LEN {
        format!("{text}…")
    } else {
        text.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::{code, Reportable};
    use crate::delegated::error::DelegatedError;

    fn exited(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    fn killed(signal: i32) -> ExitStatus {
        ExitStatus::from_raw(signal)
    }

    fn code_of(failure: Failure) -> u32 {
        DelegatedError::Failed {
            delegate: "d".into(),
            command: Command::Add,
            failure,
        }
        .code()
    }

    #[test]
    fn output_that_is_not_an_object_is_ignored_on_success_except_on_add() {
        for command in [Command::Del, Command::Check, Command::Gc, Command::Status] {
            let judged = judge(command, exited(0), b"released 10.1.0.5\n".to_vec()).unwrap();
            assert!(
                matches!(&judged, Printed::Ignored { stdout, .. } if stdout == "released 10.1.0.5"),
                "{command}: {judged:?}"
            );
        }
        assert!(judge(Command::Add, exited(0), b"hello".to_vec()).is_err());
        // A failure is judged alike for every command.
        assert!(matches!(
            judge(Command::Del, exited(2), b"oops".to_vec()),
            Err(Failure::Exited { status: 2, .. })
        ));
    }

    #[test]
    fn success_with_an_object_keeps_it_as_printed_but_trimmed() {
        let out = judge(
            Command::Add,
            exited(0),
            b"\n {\"ips\": [], \"pools\":[1]}\n\n".to_vec(),
        )
        .unwrap();
        assert_eq!(
            out,
            Printed::Object(b"{\"ips\": [], \"pools\":[1]}".to_vec())
        );
    }

    #[test]
    fn a_result_with_numbers_beyond_f64_is_passed_on_as_printed() {
        // Found by fuzzing: valid JSON, which the next delegate gets
        // exactly as printed.
        let printed = b"{\"cniipsk\":[\t\t\t\t111111111,11111111111111111111111111,11111111111394594128,111110111111111111111111111111111111111550E9511111111,11111111119111000000311111\t\t]\t\t}";
        let out = judge(Command::Add, exited(0), printed.to_vec()).unwrap();
        assert_eq!(out, Printed::Object(printed.to_vec()));
    }

    #[test]
    fn success_with_nothing_or_whitespace_is_none() {
        for printed in [&b""[..], b" \n\t"] {
            let judged = judge(Command::Add, exited(0), printed.to_vec()).unwrap();
            assert_eq!(judged, Printed::Nothing);
        }
    }

    #[test]
    fn success_with_non_json_or_non_object_is_code_6() {
        for bad in [
            &b"hello"[..],
            b"{",
            b"[1]",
            b"\"s\"",
            b"{} {}",
            b"{\"a\":1}x",
        ] {
            let failure = judge(Command::Add, exited(0), bad.to_vec()).unwrap_err();
            assert!(matches!(failure, Failure::NotObject { .. }), "{bad:?}");
            assert_eq!(code_of(failure), code::DECODING_FAILURE, "{bad:?}");
        }
    }

    #[test]
    fn a_cni_error_object_is_kept() {
        let failure = judge(
            Command::Add,
            exited(1),
            br#"{"cniVersion":"1.0.0","code":11,"msg":"busy","details":"retry"}"#.to_vec(),
        )
        .unwrap_err();
        match failure {
            Failure::Reported { code, msg, details } => {
                assert_eq!(
                    (code, msg.as_str(), details.as_str()),
                    (11, "busy", "retry")
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_non_zero_exit_without_an_error_object_names_the_status() {
        for printed in [
            &b""[..],
            b"oops",
            br#"{"msg":"no code"}"#,
            br#"{"code":0}"#,
            br#"{"code":"7"}"#,
        ] {
            let failure = judge(Command::Add, exited(3), printed.to_vec()).unwrap_err();
            assert!(
                matches!(failure, Failure::Exited { status: 3, .. }),
                "{printed:?}"
            );
            assert_eq!(code_of(failure), code::DELEGATE_EXITED);
        }
    }

    #[test]
    fn a_signal_is_named() {
        let failure = judge(Command::Add, killed(9), Vec::new()).unwrap_err();
        assert_eq!(failure.to_string(), "was killed by signal 9");
        assert_eq!(code_of(failure), code::DELEGATE_KILLED);
    }

    #[test]
    fn excerpts_are_bounded() {
        let long = vec![b'x'; 2000];
        let text = excerpt(&long);
        assert_eq!(text.chars().filter(|c| *c == 'x').count(), EXCERPT_LEN);
        assert!(text.ends_with('…'));
    }
}
