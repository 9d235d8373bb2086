//! etcd's answers as its JSON gateway writes them (protobuf's JSON: int64s
//! as strings, keys and values in base64, false and zero left out): typed
//! structures read straight from a body, every member not used skipped
//! unread, so that no tree of a whole answer is ever built.

use serde::Deserialize;

use super::base64::decode;
use super::Kv;
use crate::http::capped::at_most;

/// The most keys one answer may hold: every range asks for a page of at
/// most 4,096, or for one key.
const KEYS: usize = 8192;
/// The most of any other list: a transaction's requests, the alarms.
const OTHERS: usize = 1024;

/// An int64 as protobuf's JSON writes it: a string of digits (or, from
/// some encoders, a number).
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Int64 {
    Text(String),
    Number(i64),
}

impl Int64 {
    /// Its value, if it is one.
    pub fn value(&self) -> Option<i64> {
        match self {
            Int64::Text(text) => text.parse().ok(),
            Int64::Number(n) => Some(*n),
        }
    }
}

/// A range's answer.
#[derive(Deserialize)]
pub struct Range {
    #[serde(default, deserialize_with = "at_most::<_, _, KEYS>")]
    kvs: Vec<KvWire>,
}

#[derive(Deserialize)]
struct KvWire {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    mod_revision: Option<Int64>,
}

impl Range {
    /// Its keys and values, decoded; the error names what is not base64.
    pub fn kvs(self) -> Result<Vec<Kv>, String> {
        self.kvs
            .into_iter()
            .map(|kv| {
                let decoded = |text: &str, name: &str| {
                    decode(text).ok_or(format!("a {name} that is not base64"))
                };
                Ok(Kv {
                    key: decoded(&kv.key, "key")?,
                    value: decoded(&kv.value, "value")?,
                    mod_revision: kv.mod_revision.and_then(|r| r.value()).unwrap_or(0),
                })
            })
            .collect()
    }
}

/// A transaction's answer: whether its compares held, and what each of
/// its requests answered (ranges, for a read in one transaction).
#[derive(Deserialize)]
pub struct Txn {
    #[serde(default)]
    pub succeeded: bool,
    #[serde(default, deserialize_with = "at_most::<_, _, OTHERS>")]
    responses: Vec<TxnResponse>,
    header: Option<Header>,
}

/// The header of an answer: the cluster's revision when it was made.
#[derive(Deserialize)]
struct Header {
    revision: Option<Int64>,
}

#[derive(Deserialize)]
struct TxnResponse {
    response_range: Option<Range>,
}

impl Txn {
    /// The cluster's revision once the transaction was done (0 if the
    /// answer did not say).
    pub fn revision(&self) -> i64 {
        self.header
            .as_ref()
            .and_then(|h| h.revision.as_ref()?.value())
            .unwrap_or(0)
    }

    /// What each request answered, if it was a range.
    pub fn ranges(self) -> impl Iterator<Item = Option<Range>> {
        self.responses.into_iter().map(|r| r.response_range)
    }
}

/// A lease granted.
#[derive(Deserialize)]
pub struct LeaseGrant {
    #[serde(rename = "ID")]
    pub id: Option<Int64>,
}

/// A keep-alive's answer (its one result of a stream).
#[derive(Deserialize)]
pub struct KeepAlive {
    result: Option<KeepAliveResult>,
}

#[derive(Deserialize)]
struct KeepAliveResult {
    #[serde(rename = "TTL")]
    ttl: Option<Int64>,
}

impl KeepAlive {
    /// The seconds the lease has now; 0 (left out) when it is gone.
    pub fn ttl(&self) -> i64 {
        let ttl = self.result.as_ref().and_then(|r| r.ttl.as_ref());
        ttl.and_then(Int64::value).unwrap_or(0)
    }
}

/// How many keys a range holds (`count_only`).
#[derive(Deserialize)]
pub struct Count {
    pub count: Option<Int64>,
}

/// A member's status.
#[derive(Deserialize)]
pub struct Status {
    #[serde(rename = "dbSize")]
    pub db_size: Option<Int64>,
}

/// The cluster's alarms.
#[derive(Deserialize)]
pub struct Alarms {
    #[serde(default, deserialize_with = "at_most::<_, _, OTHERS>")]
    pub alarms: Vec<Alarm>,
}

/// One alarm, and the member that raised it.
#[derive(Deserialize)]
pub struct Alarm {
    #[serde(rename = "memberID")]
    pub member: Option<Word>,
    pub alarm: Option<String>,
}

/// A uint64 or a name, as text: the gateway writes a member's ID as a
/// string of digits, some encoders as a number.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Word {
    Text(String),
    Number(u64),
}

impl std::fmt::Display for Word {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Word::Text(text) => f.write_str(text),
            Word::Number(n) => write!(f, "{n}"),
        }
    }
}

/// A sign-in's answer.
#[derive(Deserialize)]
pub struct SignedIn {
    #[serde(default)]
    pub token: String,
}

/// A failure's body: grpc-gateway's `{"error"|"message", "code"}`, or a
/// stream's `{"error": {"message", "grpc_code"}}`.
#[derive(Deserialize)]
pub struct Failure {
    message: Option<String>,
    error: Option<Said>,
    code: Option<u64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Said {
    Text(String),
    Object {
        message: Option<String>,
        grpc_code: Option<u64>,
    },
}

impl Failure {
    /// Its message ("no message" if none) and its gRPC code (0 if none).
    pub fn said(self) -> (String, u64) {
        let (inner, inner_code) = match self.error {
            Some(Said::Text(text)) => (Some(text), None),
            Some(Said::Object { message, grpc_code }) => (message, grpc_code),
            None => (None, None),
        };
        let message = self
            .message
            .or(inner)
            .unwrap_or_else(|| "no message".into());
        (message, self.code.or(inner_code).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_decoded_and_a_key_that_is_not_base64_refused() {
        let range: Range = serde_json::from_str(
            r#"{"header": {"revision": "9"}, "kvs": [{"key": "YQ==", "value": "Yg==", "mod_revision": "7", "lease": "3"}], "count": "1"}"#,
        )
        .unwrap();
        let kvs = range.kvs().unwrap();
        assert_eq!(
            kvs,
            [Kv {
                key: b"a".to_vec(),
                value: b"b".to_vec(),
                mod_revision: 7
            }]
        );
        let range: Range = serde_json::from_str(r#"{"kvs": [{"key": "!!"}]}"#).unwrap();
        assert_eq!(range.kvs().unwrap_err(), "a key that is not base64");
        let empty: Range = serde_json::from_str(r#"{"header": {}}"#).unwrap();
        assert!(empty.kvs().unwrap().is_empty());
    }

    #[test]
    fn a_false_and_a_zero_left_out_read_as_false_and_zero() {
        let txn: Txn = serde_json::from_str(r#"{"header": {}}"#).unwrap();
        assert!(!txn.succeeded);
        let kept: KeepAlive = serde_json::from_str(r#"{"result": {"ID": "5"}}"#).unwrap();
        assert_eq!(kept.ttl(), 0);
        let kept: KeepAlive = serde_json::from_str(r#"{"result": {"TTL": "30"}}"#).unwrap();
        assert_eq!(kept.ttl(), 30);
    }
}
