//! The network configuration from stdin: the few keys the plugin reads,
//! checked, and every member kept exactly as written, to hand on to
//! delegates with a `prevResult` set.

use std::cell::OnceCell;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::value::RawValue;

use crate::environment;
use crate::error::Error;
use crate::json::{push_member, string, Members};
use crate::version;

/// The key a delegate finds the previous delegate's result under.
const PREV_RESULT: &str = "prevResult";

/// A checked network configuration.
#[derive(Debug)]
pub struct Config<'a> {
    /// Exactly the bytes the runtime wrote; the first delegate gets these.
    pub raw: &'a [u8],
    /// The configuration's cniVersion, one of [`version::SUPPORTED`].
    pub cni_version: &'static str,
    /// `ipam.delegates`: names to look up in CNI_PATH, in the order to run them.
    pub delegates: Vec<String>,
    /// `ipam.timeout`: how long one delegate call may take.
    pub timeout: Option<Duration>,
    /// The network's name.
    pub name: String,
    /// `ipam.stateDir`: where agent mode keeps its attachments, if set.
    pub state_dir: Option<PathBuf>,
    members: Members<'a>,
    frame: OnceCell<Frame>,
}

impl<'a> Config<'a> {
    /// Parses and checks stdin. Checks run in the order the codes matter to
    /// a runtime: not a JSON object (6), then the version (1), then the rest (7).
    pub fn parse(raw: &'a [u8]) -> Result<Self, Error> {
        let members: Members = serde_json::from_slice(raw).map_err(Error::ConfigNotObject)?;
        let version_field = members.get("cniVersion");
        let cni_version = version_field
            .and_then(string)
            .and_then(|v| version::supported(&v))
            .ok_or_else(|| Error::UnsupportedVersion(version_field.map(|v| v.get().to_owned())))?;
        let name = members.get("name").and_then(string).unwrap_or_default();
        if name.is_empty() {
            return Err(invalid("\"name\" must be a non-empty string"));
        }
        if !environment::is_identifier(&name) {
            return Err(Error::InvalidConfig(format!(
                "\"name\" {name:?} {}",
                environment::IDENTIFIER_RULE
            )));
        }
        let ipam = members
            .get("ipam")
            .ok_or_else(|| invalid("\"ipam\" is missing"))?;
        let ipam: Members =
            serde_json::from_str(ipam.get()).map_err(|_| invalid("\"ipam\" must be an object"))?;
        let delegates = delegates(&ipam)?;
        let timeout = ipam.get("timeout").map(timeout).transpose()?;
        let state_dir = ipam.get("stateDir").map(state_dir).transpose()?;
        Ok(Config {
            raw,
            cni_version,
            delegates,
            timeout,
            name,
            state_dir,
            members,
            frame: OnceCell::new(),
        })
    }

    /// The configuration with `prevResult` set to `result`, a delegate's
    /// printed JSON object, inserted as printed. Every other member keeps
    /// its place and is copied byte for byte; a `prevResult` the runtime sent
    /// is replaced where it stood.
    pub fn with_prev_result(&self, result: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_with_prev_result(result, &mut out);
        out
    }

    /// [`Self::with_prev_result`] written into `out`, replacing what it
    /// held and reusing its allocation.
    pub fn write_with_prev_result(&self, result: &[u8], out: &mut Vec<u8>) {
        let frame = self
            .frame
            .get_or_init(|| Frame::new(&self.members, PREV_RESULT));
        out.clear();
        out.reserve_exact(frame.head.len() + result.len() + frame.tail.len());
        out.extend_from_slice(&frame.head);
        out.extend_from_slice(result);
        out.extend_from_slice(&frame.tail);
    }

    /// The configuration with member `key` set to `value` (JSON text), in
    /// place if it is there, else at the end; everything else as it came.
    pub fn with_member(&self, key: &str, value: &[u8]) -> Vec<u8> {
        Frame::new(&self.members, key).around(value)
    }

    /// The value of top-level member `key`, as written.
    pub fn member(&self, key: &str) -> Option<&'a RawValue> {
        self.members.get(key)
    }
}

/// The cniVersion a reply should carry: the input's when it has a string
/// one, whether supported or not, else the newest supported.
pub fn reply_version(raw: &[u8]) -> String {
    serde_json::from_slice::<Members>(raw)
        .ok()
        .and_then(|members| string(members.get("cniVersion")?))
        .unwrap_or_else(|| version::NEWEST.to_owned())
}

fn invalid(reason: &str) -> Error {
    Error::InvalidConfig(reason.to_owned())
}

/// `ipam.delegates`: a non-empty array of names, each safe to look up as a
/// file name in a CNI_PATH directory.
fn delegates(ipam: &Members) -> Result<Vec<String>, Error> {
    let list = ipam
        .get("delegates")
        .ok_or_else(|| invalid("\"ipam.delegates\" is missing"))?;
    let list: Vec<&RawValue> = serde_json::from_str(list.get())
        .map_err(|_| invalid("\"ipam.delegates\" must be an array of plugin names"))?;
    if list.is_empty() {
        return Err(invalid("\"ipam.delegates\" is empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, entry)| {
            let name = string(entry).ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "\"ipam.delegates\"[{i}] must be a plugin name, not {}",
                    entry.get()
                ))
            })?;
            check_delegate_name(&name)?;
            Ok(name)
        })
        .collect()
}

/// `ipam.timeout`: seconds, from a millisecond (less rounds to nothing) to
/// a day (more is no bound a runtime waits for, and far more would overflow
/// a deadline).
fn timeout(value: &RawValue) -> Result<Duration, Error> {
    const RANGE: std::ops::RangeInclusive<f64> = 0.001..=86_400.0;
    serde_json::from_str::<f64>(value.get())
        .ok()
        .filter(|seconds| RANGE.contains(seconds))
        .map(Duration::from_secs_f64)
        .ok_or_else(|| {
            Error::InvalidConfig(format!(
                "\"ipam.timeout\" must be a number of seconds from 0.001 to 86400, not {}",
                value.get()
            ))
        })
}

/// `ipam.stateDir`: an absolute directory.
fn state_dir(value: &RawValue) -> Result<PathBuf, Error> {
    string(value)
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .ok_or_else(|| {
            Error::InvalidConfig(format!(
                "\"ipam.stateDir\" must be an absolute directory, not {}",
                value.get()
            ))
        })
}

/// Names select files inside CNI_PATH directories and must not leave them.
fn check_delegate_name(name: &str) -> Result<(), Error> {
    let bad = name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']);
    if bad {
        Err(Error::InvalidConfig(format!(
            "delegate name {name:?} is not a plain file name (empty, '.', '..', or holds '/', '\\' or NUL)"
        )))
    } else {
        Ok(())
    }
}

/// The configuration written out once without one member (`prevResult`,
/// mostly), split where that member's value goes, so each delegate's stdin
/// is both halves copied around a result.
#[derive(Debug)]
struct Frame {
    /// Up to and including `"<key>":`.
    head: Vec<u8>,
    /// Everything after the value, closing brace included.
    tail: Vec<u8>,
}

impl Frame {
    fn new(members: &Members, member: &str) -> Frame {
        let mut head = b"{".to_vec();
        let mut tail = Vec::new();
        let mut placed = false;
        for (key, value) in members.iter() {
            if key == member {
                // The first one's place takes the new value; duplicates go,
                // or a reader taking the last would see a stale one.
                if !placed {
                    separate(&mut head);
                    push_member(&mut head, key, b"");
                    placed = true;
                }
                continue;
            }
            let out = if placed { &mut tail } else { &mut head };
            if placed {
                out.push(b',');
            } else {
                separate(out);
            }
            push_member(out, key, value.get().as_bytes());
        }
        if !placed {
            separate(&mut head);
            push_member(&mut head, member, b"");
        }
        tail.push(b'}');
        Frame { head, tail }
    }

    fn around(&self, value: &[u8]) -> Vec<u8> {
        [self.head.as_slice(), value, self.tail.as_slice()].concat()
    }
}

/// A comma, unless `head` holds only the opening brace so far.
fn separate(head: &mut Vec<u8>) {
    if head.len() > 1 {
        head.push(b',');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::code;

    const GOOD: &str = r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ipam-delegated","delegates":["a","b"]}}"#;

    fn parse_err(text: &str) -> Error {
        Config::parse(text.as_bytes()).expect_err("should be refused")
    }

    fn spliced(input: &str, result: &str) -> String {
        let config = Config::parse(input.as_bytes()).unwrap();
        String::from_utf8(config.with_prev_result(result.as_bytes())).unwrap()
    }

    #[test]
    fn a_good_config_is_read() {
        let c = Config::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(c.cni_version, "1.0.0");
        assert_eq!(c.delegates, ["a", "b"]);
        assert_eq!(c.raw, GOOD.as_bytes());
    }

    #[test]
    fn not_json_or_not_an_object_is_code_6() {
        for text in [
            "",
            "nope",
            "{",
            "[1]",
            "\"s\"",
            "3",
            "null",
            "{\"a\":1}x",
            "{\"a\":}",
        ] {
            assert_eq!(parse_err(text).code(), code::DECODING_FAILURE, "{text:?}");
        }
        let e = Config::parse(b"{\"cniVersion\":\"1.0.0\xff\"}").unwrap_err();
        assert_eq!(e.code(), code::DECODING_FAILURE);
    }

    #[test]
    fn version_missing_unsupported_or_not_a_string_is_code_1_and_shown() {
        let cases = [
            (r#"{}"#, "cniVersion (missing)"),
            (r#"{"cniVersion":"0.2.0"}"#, r#"cniVersion "0.2.0" is"#),
            (r#"{"cniVersion":1}"#, "cniVersion 1 is"),
        ];
        for (text, shown) in cases {
            let e = parse_err(text);
            assert_eq!(e.code(), code::INCOMPATIBLE_VERSION, "{text}");
            assert!(e.to_string().starts_with(shown), "{e}");
        }
    }

    #[test]
    fn name_must_be_a_non_empty_string() {
        for name in [None, Some("1"), Some("\"\"")] {
            let text = match name {
                Some(n) => GOOD.replace(r#""name":"n""#, &format!(r#""name":{n}"#)),
                None => GOOD.replace(r#""name":"n","#, ""),
            };
            let e = parse_err(&text);
            assert_eq!(e.code(), code::INVALID_CONFIG, "{text}");
            assert!(e.to_string().contains("\"name\""));
        }
    }

    #[test]
    fn delegates_must_be_a_non_empty_list_of_names() {
        let cases = [
            (r#""ipam":{}"#, "is missing"),
            (r#""ipam":3"#, "\"ipam\" must be an object"),
            (r#""ipam":{"delegates":"a"}"#, "must be an array"),
            (r#""ipam":{"delegates":[]}"#, "is empty"),
            (
                r#""ipam":{"delegates":["a",1]}"#,
                "[1] must be a plugin name, not 1",
            ),
            (
                r#""ipam":{"delegates":[null]}"#,
                "[0] must be a plugin name, not null",
            ),
        ];
        for (ipam, expect) in cases {
            let text = format!(r#"{{"cniVersion":"0.3.1","name":"n",{ipam}}}"#);
            let e = parse_err(&text);
            assert_eq!(e.code(), code::INVALID_CONFIG, "{ipam}");
            assert!(e.to_string().contains(expect), "{ipam}: {e}");
        }
        let e = parse_err(r#"{"cniVersion":"0.3.1","name":"n"}"#);
        assert!(e.to_string().contains("\"ipam\" is missing"));
    }

    #[test]
    fn timeout_is_seconds_from_a_millisecond_to_a_day() {
        let with = |t: &str| {
            format!(
                r#"{{"cniVersion":"1.0.0","name":"n","ipam":{{"delegates":["a"],"timeout":{t}}}}}"#
            )
        };
        let input = with("2.5");
        let c = Config::parse(input.as_bytes()).unwrap();
        assert_eq!(c.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(Config::parse(GOOD.as_bytes()).unwrap().timeout, None);
        let input = with("86400");
        let c = Config::parse(input.as_bytes()).unwrap();
        assert_eq!(c.timeout, Some(Duration::from_secs(86_400)));
        let bad = [
            "0", "-1", "\"5\"", "null", "true", "[1]", "{}", "1e400", "1e300", "-0.0", "1e19",
            "9.3e18", "1e-300", "0.0009", "86400.5",
        ];
        for bad in bad {
            let e = parse_err(&with(bad));
            assert_eq!(e.code(), code::INVALID_CONFIG, "{bad}");
            let expected = "\"ipam.timeout\" must be a number of seconds from 0.001 to 86400";
            assert!(e.to_string().contains(expected), "{e}");
        }
    }

    #[test]
    fn names_that_could_leave_cni_path_are_refused() {
        for name in ["", ".", "..", "../x", "a/b", "/bin/sh", "a\\b", "a\u{0}b"] {
            let e = check_delegate_name(name).unwrap_err();
            assert_eq!(e.code(), code::INVALID_CONFIG, "{name:?}");
        }
        for name in ["host-local", "ipam-ds-x", "...", "a.b", "é"] {
            assert!(check_delegate_name(name).is_ok(), "{name:?}");
        }
    }

    #[test]
    fn name_follows_the_specs_rule_for_network_names() {
        for good in ["n", "0", "pods-v4", "a_b.c-d", "x..y"] {
            let text = GOOD.replace(r#""name":"n""#, &format!(r#""name":"{good}""#));
            assert_eq!(Config::parse(text.as_bytes()).unwrap().name, good);
        }
        for bad in ["-n", "_n", ".n", "a b", "a/b", "../x", "a:b", "é", "n\\n"] {
            let text = GOOD.replace(r#""name":"n""#, &format!(r#""name":"{bad}""#));
            let e = parse_err(&text);
            assert_eq!(e.code(), code::INVALID_CONFIG, "{bad}");
            assert!(
                e.to_string().contains("must start with a letter or digit"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn duplicated_keys_read_as_the_last_one() {
        let text = r#"{"cniVersion":"0.2.0","cniVersion":"1.0.0","name":"n","ipam":{"delegates":["x"],"delegates":["a"]}}"#;
        let c = Config::parse(text.as_bytes()).unwrap();
        assert_eq!(
            (c.cni_version, c.delegates.as_slice()),
            ("1.0.0", &["a".to_string()][..])
        );
    }

    #[test]
    fn other_members_are_copied_exactly_and_prev_result_appended() {
        let input = r#"{"cniVersion":"1.0.0", "name":"n","zeta":1.50,"ipam":{ "delegates":["a"], "big":123456789012345678901234567890, "e":1e3 },"alpha":"\u00e9\ud800","$serde_json::private::Number":"x"}"#;
        assert_eq!(
            spliced(input, r#"{"ips":[], "x":1e3}"#),
            r#"{"cniVersion":"1.0.0","name":"n","zeta":1.50,"ipam":{ "delegates":["a"], "big":123456789012345678901234567890, "e":1e3 },"alpha":"\u00e9\ud800","$serde_json::private::Number":"x","prevResult":{"ips":[], "x":1e3}}"#
        );
    }

    #[test]
    fn numbers_beyond_f64_pass_through_as_written() {
        // Found by fuzzing (fuzz/artifacts/config/crash-802178ff…): valid
        // JSON, out of f64's range, and no business of the plugin's.
        let input = "   {\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"ipam\":{\"delegates\":[\"a\",\"b\"],\n\"4imiiii]]]]]]]iciii.iiiexut\":1E44222222}}";
        let out = spliced(input, "{}");
        assert!(
            out.contains(r#""4imiiii]]]]]]]iciii.iiiexut":1E44222222}"#),
            "{out}"
        );
        serde_json::from_str::<&RawValue>(&out).unwrap();
    }

    #[test]
    fn deep_values_pass_through_unparsed() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let input = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","ipam":{{"delegates":["a"]}},"deep":{deep}}}"#
        );
        assert!(spliced(&input, "{}").contains(&deep));
    }

    #[test]
    fn a_runtime_prev_result_is_replaced_in_place_and_duplicates_dropped() {
        let input = r#"{"cniVersion":"1.0.0","prevResult":{"old":1},"name":"n","prevResult":{"old":2},"ipam":{"delegates":["a"]}}"#;
        assert_eq!(
            spliced(input, r#"{"new":true}"#),
            r#"{"cniVersion":"1.0.0","prevResult":{"new":true},"name":"n","ipam":{"delegates":["a"]}}"#
        );
        let first =
            r#"{"prevResult":{},"cniVersion":"1.0.0","name":"n","ipam":{"delegates":["a"]}}"#;
        assert!(spliced(first, "{}").starts_with(r#"{"prevResult":{},"cniVersion""#));
    }

    #[test]
    fn keys_are_re_escaped_as_json() {
        let input =
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"delegates":["a"]},"q\"k\u0041":0}"#;
        let out = spliced(input, "{}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["q\"kA"], 0);
    }

    #[test]
    fn reply_version_is_the_inputs_or_the_newest() {
        assert_eq!(reply_version(br#"{"cniVersion":"0.4.0"}"#), "0.4.0");
        assert_eq!(reply_version(br#"{"cniVersion":"9.9.9"}"#), "9.9.9");
        assert_eq!(reply_version(b"not json"), version::NEWEST);
        assert_eq!(reply_version(br#"{"cniVersion":4}"#), version::NEWEST);
        assert_eq!(reply_version(b"[]"), version::NEWEST);
    }
}
