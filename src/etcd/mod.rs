//! A client of etcd's v3 API through its JSON gateway: the cluster's
//! settings (endpoints, key prefix, TLS with a client certificate, a
//! timeout, a user and its password), one kept-alive connection that
//! moves on to the next endpoint when one fails, a sign-in renewed when
//! its token expires, and the calls the pools make (range, txn, leases),
//! each bounded by the timeout. A cluster that cannot answer is code 11:
//! try again later; a refusal that waiting would not change is not.

mod base64;
mod settings;
mod txn;
mod wire;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::ClientConfig;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::{json, Value};

use crate::cni::{self, code, Reportable};
use crate::http;
use crate::http::client::{self as connection, Connection};
use crate::http::socket::interrupted;
use crate::signals::Interrupted;
use base64::encode;
pub use settings::EtcdSettings;
pub use txn::{Compare, Op, Outcome, Read};

/// How the etcd cluster fails a call, or a client cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The settings name files (TLS, a password) that cannot be used.
    #[error(transparent)]
    Settings(cni::Error),

    /// The cluster cannot answer now: unreachable, no quorum, out of
    /// time. Nothing of the command is half done: try again later.
    #[error("the etcd cluster ({endpoints}) cannot answer now: {reason}; try again later")]
    Unavailable {
        endpoints: String,
        /// What the last endpoint tried did.
        reason: String,
    },

    /// No member of the cluster would complete TLS with this client:
    /// certificates to fix, not a cluster to wait for.
    #[error("TLS with the etcd cluster failed ({endpoint}: {reason}): check \"ipam.pool.etcd.tls\" and the members' certificates")]
    Tls { endpoint: String, reason: String },

    /// A member closed the connection without a word, and answers in the
    /// other scheme: an endpoint given as https:// that speaks plain HTTP,
    /// or as http:// that speaks TLS. A setting to fix.
    #[error("etcd endpoint {endpoint} {}", if *speaks_tls {
        "speaks TLS, not plain HTTP: give it as https:// in \"ipam.pool.etcd.endpoints\" (with \"ipam.pool.etcd.tls\")"
    } else {
        "speaks plain HTTP, not TLS: give it as http:// in \"ipam.pool.etcd.endpoints\""
    })]
    Scheme { endpoint: String, speaks_tls: bool },

    /// A termination request came while a member was awaited.
    #[error(transparent)]
    Interrupted(#[from] Interrupted),

    /// The cluster refused a request (its HTTP status and message).
    #[error("the etcd cluster refused a request ({status}): {message}")]
    Refused { status: u16, message: String },

    /// The cluster's database is at its quota (a NOSPACE alarm): it takes
    /// deletes, no puts, until an operator compacts, defragments and
    /// disarms it.
    #[error("the etcd cluster's database is full ({message}: a NOSPACE alarm): compact and defragment it, then `etcdctl alarm disarm`; try again later")]
    NoSpace { message: String },

    /// The cluster refused this client's authentication or the user's
    /// permissions: credentials to fix, not a cluster to wait for.
    #[error("etcd authentication failed ({message}): check \"ipam.pool.etcd.username\", \"passwordFile\" and the user's role")]
    Auth { message: String },
}

impl EtcdError {
    /// Whether a write that failed so may have been applied all the same:
    /// a cluster that could not answer in time may have taken the request
    /// before its answer was lost (a stalled client, a member gone
    /// mid-request).
    pub fn may_have_landed(&self) -> bool {
        matches!(self, EtcdError::Unavailable { .. })
    }
}

impl Reportable for EtcdError {
    fn code(&self) -> u32 {
        match self {
            EtcdError::Settings(e) => e.code(),
            EtcdError::Interrupted(e) => e.code(),
            EtcdError::Unavailable { .. } | EtcdError::NoSpace { .. } => code::TRY_AGAIN_LATER,
            EtcdError::Refused { .. }
            | EtcdError::Tls { .. }
            | EtcdError::Scheme { .. }
            | EtcdError::Auth { .. } => code::IO_FAILURE,
        }
    }
}

/// What a member's answer may be: a page of [`PREFIX_PAGE`] of the
/// pools' records, with their values, base64 in JSON, is about 1.5 MiB,
/// and one value at most etcd's request limit, 1.5 MiB; a larger answer
/// is a broken member, refused before it takes the node's memory.
const ANSWERS: http::Limits = http::Limits {
    line: 64 * 1024,
    headers: 128,
    body: 16 << 20,
};

/// The least time one try at one member gets, within the call's timeout.
const MIN_TRY: Duration = Duration::from_millis(500);

/// How many keys one read of [`EtcdClient::with_prefix`] asks for.
const PREFIX_PAGE: usize = 4096;

/// The most pages [`EtcdClient::with_prefix`] reads: 4 million keys, 30
/// times a 90 %-full /16.
const PREFIX_PAGES: usize = 1024;

/// This process's tries of a request to a member, and those that failed
/// (unreached, out of time, refused): what its command leaves for the
/// node's metrics.
static TRIED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);

/// This process's tries of a request to etcd so far, and how many failed.
pub fn requests() -> (u64, u64) {
    (
        TRIED.load(Ordering::Relaxed),
        FAILED.load(Ordering::Relaxed),
    )
}

/// How long a call waits before it tries every endpoint again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// gRPC codes that mean "not now" rather than "no": deadline exceeded,
/// resource exhausted, aborted, unavailable.
const TRANSIENT: [u64; 4] = [4, 8, 10, 14];

/// gRPC codes of a refused authentication: permission denied,
/// unauthenticated.
const AUTH: [u64; 2] = [7, 16];

/// What [`EtcdClient::health`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// The member asked.
    pub endpoint: String,
    /// Its database's size, in bytes.
    pub db_size: u64,
    /// Its quota, in bytes, if its metrics said.
    pub quota: Option<u64>,
    /// The cluster's alarms, each with the member that raised it.
    pub alarms: Vec<String>,
}

/// A key and its value, as a range read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    /// The key.
    pub key: Vec<u8>,
    /// Its value (empty in a keys-only read).
    pub value: Vec<u8>,
    /// The revision of its last write, for a transaction's compare.
    pub mod_revision: i64,
}

/// A client: the settings, the TLS configuration they make, and the
/// connection in use, with the index of its endpoint.
pub struct EtcdClient {
    settings: EtcdSettings,
    tls: Option<Arc<ClientConfig>>,
    connection: RefCell<Option<(usize, Connection)>>,
    /// The endpoint that answered last: the next call starts there, not
    /// at a member that failed it (a wedged one costs a try's share of
    /// the timeout each time it is tried).
    answered: Cell<Option<usize>>,
    /// The user and password to sign in with, if the settings name one.
    credentials: Option<(String, String)>,
    /// The token of the last sign-in, until the cluster says it expired.
    token: RefCell<Option<String>>,
}

impl EtcdClient {
    /// A client for `settings`; nothing is connected until the first call.
    /// TLS files that cannot be read are code 7.
    pub fn new(settings: EtcdSettings) -> Result<EtcdClient, EtcdError> {
        let tls = match &settings.tls {
            None => None,
            Some(files) => Some(
                files
                    .load()
                    .map_err(|reason| invalid(format!("\"ipam.pool.etcd.tls\": {reason}")))?,
            ),
        };
        let credentials = match &settings.credentials {
            None => None,
            Some((user, file)) => Some((
                user.clone(),
                crate::secret::read(file).map_err(|reason| {
                    invalid(format!("\"ipam.pool.etcd.passwordFile\": {reason}"))
                })?,
            )),
        };
        Ok(EtcdClient {
            settings,
            tls,
            connection: RefCell::new(None),
            answered: Cell::new(None),
            credentials,
            token: RefCell::new(None),
        })
    }

    /// The settings the client was made with.
    pub fn settings(&self) -> &EtcdSettings {
        &self.settings
    }

    /// The value of `key`, if it exists.
    pub fn get(&self, key: &[u8]) -> Result<Option<Kv>, EtcdError> {
        let answer: wire::Range = self.call("/v3/kv/range", &json!({ "key": encode(key) }))?;
        Ok(self.kvs(answer)?.into_iter().next())
    }

    /// The values of `keys`, each if it exists, read in one request at
    /// one revision.
    pub fn get_each(&self, keys: &[&[u8]]) -> Result<Vec<Option<Kv>>, EtcdError> {
        let ranges: Vec<Value> = keys
            .iter()
            .map(|key| json!({"request_range": {"key": encode(key)}}))
            .collect();
        let answer: wire::Txn = self.call("/v3/kv/txn", &json!({"success": ranges}))?;
        let mut ranges = answer.ranges();
        keys.iter()
            .map(|_| match ranges.next().flatten() {
                Some(range) => Ok(self.kvs(range)?.into_iter().next()),
                None => Ok(None),
            })
            .collect()
    }

    /// The keys from `from` up to (not including) `to`, in order, at most
    /// `limit` of them (0: all), with their values unless `keys_only`.
    pub fn range(
        &self,
        from: &[u8],
        to: &[u8],
        limit: usize,
        keys_only: bool,
    ) -> Result<Vec<Kv>, EtcdError> {
        let request = json!({
            "key": encode(from),
            "range_end": encode(to),
            "limit": limit.to_string(),
            "keys_only": keys_only,
        });
        let answer: wire::Range = self.call("/v3/kv/range", &request)?;
        self.kvs(answer)
    }

    /// How many keys there are from `from` up to (not including) `to`:
    /// counted by the member, no key sent.
    pub fn count(&self, from: &[u8], to: &[u8]) -> Result<u64, EtcdError> {
        let request = json!({
            "key": encode(from),
            "range_end": encode(to),
            "count_only": true,
        });
        let answer: wire::Count = self.call("/v3/kv/range", &request)?;
        // Protobuf's JSON leaves a count of 0 out.
        let count = answer.count.and_then(|c| c.value()).unwrap_or(0);
        Ok(count.max(0).unsigned_abs())
    }

    /// Every key that starts with `prefix`, with its value, read a page
    /// of [`PREFIX_PAGE`] keys at a time: each read is one short request
    /// that other clients' requests go between (a 90 %-full /16 is 120,000
    /// keys, 40 MB of JSON at once), and no answer nears the reader's cap.
    /// The pages are read at different revisions: a key written meanwhile
    /// may be in or out, as with any read that is not a transaction.
    pub fn with_prefix(&self, prefix: &[u8]) -> Result<Vec<Kv>, EtcdError> {
        self.between(prefix, &prefix_end(prefix))
    }

    /// Every key from `from` up to (not including) `to`, with its value,
    /// read a page at a time as [`EtcdClient::with_prefix`] reads.
    pub fn between(&self, from: &[u8], end: &[u8]) -> Result<Vec<Kv>, EtcdError> {
        let mut found = Vec::new();
        let mut from = from.to_vec();
        for _ in 0..PREFIX_PAGES {
            let page = self.range(&from, end, PREFIX_PAGE, false)?;
            let more = page.len() == PREFIX_PAGE;
            if let Some(last) = page.last() {
                let mut next = last.key.clone();
                next.push(0);
                // A member that answers the same page again, or an earlier
                // one, would be read for ever.
                if next <= from {
                    return Err(EtcdError::Refused {
                        status: 200,
                        message: "a page of keys that does not move past the last one read".into(),
                    });
                }
                from = next;
            }
            found.extend(page);
            if !more {
                return Ok(found);
            }
        }
        Err(EtcdError::Refused {
            status: 200,
            message: format!("more than {PREFIX_PAGES} pages of {PREFIX_PAGE} keys in one read"),
        })
    }

    /// A new lease of `ttl` seconds: its ID.
    pub fn grant_lease(&self, ttl: u64) -> Result<i64, EtcdError> {
        let answer: wire::LeaseGrant =
            self.call("/v3/lease/grant", &json!({"TTL": ttl.to_string()}))?;
        answer
            .id
            .and_then(|id| id.value())
            .filter(|id| *id != 0)
            .ok_or_else(|| self.unavailable("a lease grant without an ID".into()))
    }

    /// Renews lease `id` for its TTL: the seconds it has now, or `None`
    /// if it is gone (expired, or revoked).
    pub fn keep_lease(&self, id: i64) -> Result<Option<u64>, EtcdError> {
        // A stream of one request: the gateway answers with one result.
        let answer: wire::KeepAlive =
            self.call("/v3/lease/keepalive", &json!({"ID": id.to_string()}))?;
        // Protobuf's JSON leaves a TTL of 0 (the lease is gone) out.
        Ok(u64::try_from(answer.ttl()).ok().filter(|ttl| *ttl > 0))
    }

    /// How full the database of the member the client talks to is, and
    /// the cluster's alarms (NOSPACE, CORRUPT): for an operator's check.
    /// The quota is read from the member's metrics, `None` if they cannot
    /// be read.
    pub fn health(&self) -> Result<Health, EtcdError> {
        let status: wire::Status = self.call("/v3/maintenance/status", &json!({}))?;
        let alarms: wire::Alarms = self.call("/v3/maintenance/alarm", &json!({"action": "GET"}))?;
        let endpoint = self
            .connection
            .borrow()
            .as_ref()
            .map_or(0, |(index, _)| *index);
        Ok(Health {
            endpoint: self.settings.endpoints[endpoint].to_string(),
            db_size: status
                .db_size
                .and_then(|size| size.value())
                .unwrap_or(0)
                .max(0)
                .unsigned_abs(),
            quota: self.quota(endpoint),
            alarms: alarms
                .alarms
                .into_iter()
                .map(|alarm| {
                    let member = alarm.member.map_or("?".into(), |m| m.to_string());
                    let kind = alarm.alarm.as_deref().unwrap_or("?");
                    format!("{kind} (member {member})")
                })
                .collect(),
        })
    }

    /// The quota of endpoint `index`'s database, from its `/metrics`.
    fn quota(&self, index: usize) -> Option<u64> {
        let endpoint = &self.settings.endpoints[index];
        let deadline = Instant::now() + self.settings.timeout;
        let tls = self.tls.as_ref().filter(|_| endpoint.tls);
        let mut connection =
            Connection::open(&endpoint.host, endpoint.port, tls, deadline, ANSWERS).ok()?;
        let (status, body) = connection.get("/metrics", deadline).ok()?;
        if status != 200 {
            return None;
        }
        let text = String::from_utf8_lossy(&body);
        let line = text
            .lines()
            .find(|line| line.starts_with("etcd_server_quota_backend_bytes "))?;
        let value: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        // A byte count, written as a float by the exposition format.
        Some(value as u64)
    }

    /// Ends lease `id`, and with it the keys put under it.
    pub fn revoke_lease(&self, id: i64) -> Result<(), EtcdError> {
        match self.call::<IgnoredAny>("/v3/lease/revoke", &json!({"ID": id.to_string()})) {
            // Gone already: what revoking it was for.
            Err(EtcdError::Refused { message, .. }) if message.contains("not found") => Ok(()),
            other => other.map(drop),
        }
    }

    /// POSTs `request` to `path` within the timeout: on the connection in
    /// use, else each endpoint in turn, starting from one that depends on
    /// the process, so that nodes spread over the members; round after
    /// round, a little apart, until the deadline. An endpoint that cannot
    /// be reached, breaks the connection, or answers "not now" (no leader
    /// during an election, a member cut off from the quorum) gives way to
    /// the next: every request the pools make is safe to send twice, since
    /// they read again what a transaction's outcome was.
    ///
    /// With credentials, the call carries the token of a sign-in, made
    /// first if there is none; a token the cluster says is no longer
    /// valid (etcd's simple tokens expire) is replaced by a new sign-in,
    /// once.
    fn call<T: DeserializeOwned>(&self, path: &str, request: &Value) -> Result<T, EtcdError> {
        let body = request.to_string().into_bytes();
        let Some((user, password)) = &self.credentials else {
            return self.exchange(path, &body, None);
        };
        let mut signed_in_again = false;
        loop {
            let token = self.token.borrow().clone();
            let token = match token {
                Some(token) => token,
                None => {
                    let sign_in = json!({"name": user, "password": password}).to_string();
                    match self.exchange::<wire::SignedIn>(
                        "/v3/auth/authenticate",
                        sign_in.as_bytes(),
                        None,
                    ) {
                        // Credentials for a cluster that asks for none.
                        Err(EtcdError::Refused { message, .. })
                            if message.contains("authentication is not enabled") =>
                        {
                            return self.exchange(path, &body, None);
                        }
                        answer => {
                            let token = answer?.token;
                            // It goes into every request's Authorization:
                            // a line break there would add headers of the
                            // member's making.
                            if token.bytes().any(|b| !b.is_ascii_graphic()) {
                                return Err(EtcdError::Refused {
                                    status: 200,
                                    message: "the sign-in answered a token that holds a space or a control character: refused".into(),
                                });
                            }
                            *self.token.borrow_mut() = Some(token.clone());
                            token
                        }
                    }
                }
            };
            match self.exchange(path, &body, Some(&token)) {
                Err(e) if stale_token(&e) && !signed_in_again => {
                    signed_in_again = true;
                    self.token.borrow_mut().take();
                }
                answered => return answered,
            }
        }
    }

    /// [`EtcdClient::call`]'s exchange with the cluster: `body` POSTed with
    /// `token`, if any.
    fn exchange<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &[u8],
        token: Option<&str>,
    ) -> Result<T, EtcdError> {
        let deadline = Instant::now() + self.settings.timeout;
        let count = self.settings.endpoints.len();
        let mut first = self
            .connection
            .borrow()
            .as_ref()
            .map(|(index, _)| *index)
            .or(self.answered.get())
            .unwrap_or(std::process::id() as usize % count);
        // What the tries said, kept across rounds.
        let mut last_error: Option<String> = None;
        loop {
            // What waiting will not mend: TLS, or the scheme, refused.
            let mut settled = Vec::new();
            for index in (0..count).map(|i| (first + i) % count) {
                // A member may hold a request past the whole budget (one
                // forwarded to a leader that died waits for etcd's own
                // timeout): each try gets a share, and the next member
                // the rest.
                let share = (self.settings.timeout / 4).max(MIN_TRY);
                let try_deadline = deadline.min(Instant::now() + share);
                let tried = self.call_one(index, path, token, body, try_deadline);
                TRIED.fetch_add(1, Ordering::Relaxed);
                if tried.is_err() {
                    FAILED.fetch_add(1, Ordering::Relaxed);
                }
                match tried {
                    // Running out of time says less than what came before
                    // it (an answer over its limit, a refusal).
                    Err(EtcdError::Unavailable { reason, .. })
                        if !(reason.ends_with("out of time") && last_error.is_some()) =>
                    {
                        last_error = Some(reason);
                    }
                    Err(EtcdError::Unavailable { .. }) => {}
                    // Perhaps this member's certificate only: the next.
                    Err(tls @ (EtcdError::Tls { .. } | EtcdError::Scheme { .. })) => {
                        settled.push(tls)
                    }
                    answered => return answered,
                }
            }
            // TLS failed with every member: waiting mends no certificate.
            // With some only, the others may answer later.
            if settled.len() == count {
                return Err(settled.swap_remove(0));
            }
            let pause = deadline
                .saturating_duration_since(Instant::now())
                .min(RETRY_PAUSE);
            if pause < RETRY_PAUSE {
                return Err(
                    self.unavailable(last_error.unwrap_or_else(|| "no endpoint tried".into()))
                );
            }
            // A termination request cuts the pause short; the next try's
            // connection then says so.
            crate::signals::wait(pause);
            first = (first + 1) % count;
        }
    }

    /// One try of a call at endpoint `index`, on its connection (opened if
    /// need be, dropped if it fails).
    fn call_one<T: DeserializeOwned>(
        &self,
        index: usize,
        path: &str,
        token: Option<&str>,
        body: &[u8],
        deadline: Instant,
    ) -> Result<T, EtcdError> {
        let endpoint = &self.settings.endpoints[index];
        let mut slot = self.connection.borrow_mut();
        let kept = match slot.take() {
            Some((used, connection)) if used == index => Some(connection),
            _ => None,
        };
        let fresh = kept.is_none();
        let failed = |e: std::io::Error| {
            let at = format!("{}:{}", endpoint.host, endpoint.port);
            let tls = e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>());
            // Closed (or reset, its request unread) before a word: what a
            // member does with a connection in a scheme it does not speak.
            // A kept connection the member closed is only an idle one.
            let wordless = fresh
                && matches!(
                    e.kind(),
                    std::io::ErrorKind::UnexpectedEof
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::BrokenPipe
                );
            if let Some(stopped) = interrupted(&e) {
                return EtcdError::Interrupted(stopped.clone());
            }
            match tls {
                Some(tls) => EtcdError::Tls {
                    endpoint: at,
                    reason: tls.to_string(),
                },
                None if wordless
                    && connection::speaks_the_other_scheme(
                        &endpoint.host,
                        endpoint.port,
                        endpoint.tls,
                        deadline,
                    ) =>
                {
                    EtcdError::Scheme {
                        endpoint: at,
                        speaks_tls: !endpoint.tls,
                    }
                }
                None => self.unavailable(format!("{at}: {e}")),
            }
        };
        let mut connection = match kept {
            Some(connection) => connection,
            None => {
                let tls = if endpoint.tls {
                    self.tls.as_ref()
                } else {
                    None
                };
                Connection::open(&endpoint.host, endpoint.port, tls, deadline, ANSWERS)
                    .map_err(failed)?
            }
        };
        // A connection that failed is not kept.
        let (status, answer) = connection
            .post(path, token, body, deadline)
            .map_err(failed)?;
        *slot = Some((index, connection));
        self.answered.set(Some(index));
        self.answer(status, &answer)
    }

    /// A gateway's answer: a success read as `T`, or which failure it is.
    fn answer<T: DeserializeOwned>(&self, status: u16, body: &[u8]) -> Result<T, EtcdError> {
        if status == 200 {
            return serde_json::from_slice(body).map_err(|e| {
                self.unavailable(format!("an answer of status 200 that is not etcd's ({e})"))
            });
        }
        let failure: wire::Failure = match serde_json::from_slice(body) {
            Ok(failure) => failure,
            // Not the gateway (a proxy's page, a gateway turned off):
            // a 4xx says no, which waiting would not change.
            Err(e) if (400..500).contains(&status) && ![408, 429].contains(&status) => {
                let text = String::from_utf8_lossy(body);
                let start: String = text.trim().chars().take(120).collect();
                return Err(EtcdError::Refused {
                    status,
                    message: format!("an answer that is not etcd's JSON ({e}): {start:?}"),
                });
            }
            Err(e) => {
                return Err(self.unavailable(format!(
                    "an answer of status {status} that is not JSON ({e})"
                )))
            }
        };
        let (message, code) = failure.said();
        // Not worth another member: the quota is the cluster's.
        if message.contains("database space exceeded") {
            return Err(EtcdError::NoSpace { message });
        }
        // Unauthenticated, permission denied, or a sign-in refused (or
        // missing: "user name is empty").
        if AUTH.contains(&code)
            || message.contains("authentication failed")
            || message.contains("user name is empty")
        {
            return Err(EtcdError::Auth { message });
        }
        if TRANSIENT.contains(&code) || status == 503 {
            Err(self.unavailable(message))
        } else {
            Err(EtcdError::Refused { status, message })
        }
    }

    /// The keys and values of a range's answer; one that is not base64
    /// is a refusal.
    fn kvs(&self, range: wire::Range) -> Result<Vec<Kv>, EtcdError> {
        range.kvs().map_err(|message| EtcdError::Refused {
            status: 200,
            message,
        })
    }

    fn unavailable(&self, reason: String) -> EtcdError {
        EtcdError::Unavailable {
            endpoints: self.settings.described(),
            reason,
        }
    }
}

/// Whether `error` says the token a request carried is no longer good: an
/// expired simple token, or one issued before the auth store changed (a
/// user or role added or granted meanwhile), which a new sign-in mends.
fn stale_token(error: &EtcdError) -> bool {
    match error {
        EtcdError::Auth { message } | EtcdError::Refused { message, .. } => {
            message.contains("invalid auth token")
                || message.contains("revision of auth store is old")
        }
        _ => false,
    }
}

/// Settings that name files that cannot be used: code 7.
fn invalid(reason: String) -> EtcdError {
    EtcdError::Settings(cni::Error::InvalidConfig(reason))
}

/// The key just after every key that starts with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every key: etcd's "\0" range end.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_prefix_is_just_after_it() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }

    #[test]
    fn a_cluster_that_cannot_be_reached_is_try_again_later() {
        // A port nothing listens on: connections are refused at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let settings = EtcdSettings::parse(
            &json!({"endpoints": [format!("127.0.0.1:{port}")], "timeout": 0.3}),
        )
        .unwrap();
        let error = EtcdClient::new(settings).unwrap().get(b"k").unwrap_err();
        assert_eq!(error.code(), code::TRY_AGAIN_LATER);
        assert!(
            error.to_string().contains(&format!("127.0.0.1:{port}")),
            "{error}"
        );
    }

    /// A server that answers every request on every connection with
    /// `answer`: its port.
    fn answering(answer: &'static [u8]) -> u16 {
        answering_in_turn(vec![answer], Default::default())
    }

    /// A server that answers the requests it gets, on any connection, with
    /// `answers` in turn (the last one again once they are used up), and
    /// keeps each request's first line and Authorization header: its port.
    fn answering_in_turn(
        answers: Vec<&'static [u8]>,
        seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    ) -> u16 {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (answers, seen, next) = (answers.clone(), seen.clone(), next.clone());
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                std::thread::spawn(move || loop {
                    let (mut length, mut request) = (0, String::new());
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                        if request.is_empty() {
                            request = line.trim().to_owned();
                        } else if lower.starts_with("authorization:") {
                            request = format!("{request} {}", line.trim());
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    std::io::Read::read_exact(&mut reader, &mut body).unwrap();
                    seen.lock().unwrap().push(request);
                    let turn = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let answer = answers[turn.min(answers.len() - 1)];
                    if writer.write_all(answer).is_err() {
                        return;
                    }
                });
            }
        });
        port
    }

    #[test]
    fn a_token_of_an_older_auth_store_is_replaced_by_a_new_sign_in() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "secret\n").unwrap();
        std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o600)).unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        // Each answer built whole, its length counted.
        let answer = |status: &str, body: &str| -> &'static [u8] {
            let text = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            Box::leak(text.into_bytes().into_boxed_slice())
        };
        let port = answering_in_turn(
            vec![
                answer("200 OK", r#"{"token":"old1"}"#),
                answer(
                    "400 Bad Request",
                    r#"{"error":"etcdserver: revision of auth store is old","code":3}"#,
                ),
                answer("200 OK", r#"{"token":"new2"}"#),
                answer("200 OK", "{}"),
            ],
            seen.clone(),
        );
        let settings = EtcdSettings::parse(&json!({
            "endpoints": [format!("127.0.0.1:{port}")], "timeout": 2,
            "username": "ipam", "passwordFile": password,
        }))
        .unwrap();
        let client = EtcdClient::new(settings).unwrap();
        let got = client.get(b"k");
        let seen = seen.lock().unwrap();
        assert_eq!(got.unwrap_or_else(|e| panic!("{e}: {seen:?}")), None);
        assert_eq!(
            *seen,
            [
                "POST /v3/auth/authenticate HTTP/1.1",
                "POST /v3/kv/range HTTP/1.1 Authorization: old1",
                "POST /v3/auth/authenticate HTTP/1.1",
                "POST /v3/kv/range HTTP/1.1 Authorization: new2",
            ]
        );
    }

    #[test]
    fn pages_under_a_prefix_that_do_not_move_on_are_refused() {
        // Every page the same: a full page of one key.
        let kv = format!(
            r#"{{"key":"{}","value":"","mod_revision":"2"}}"#,
            encode(b"/p/k")
        );
        let body = format!(r#"{{"kvs":[{}]}}"#, vec![kv; PREFIX_PAGE].join(","));
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let seen = std::sync::Arc::default();
        let port = answering_in_turn(
            vec![Box::leak(answer.into_bytes().into_boxed_slice())],
            seen,
        );
        let settings =
            EtcdSettings::parse(&json!({"endpoints": [format!("127.0.0.1:{port}")], "timeout": 5}))
                .unwrap();
        let error = EtcdClient::new(settings)
            .unwrap()
            .with_prefix(b"/p/")
            .unwrap_err();
        assert!(error.to_string().contains("does not move past"), "{error}");
    }

    #[test]
    fn a_4xx_that_is_not_etcds_json_is_a_prompt_refusal_and_a_5xx_is_try_again_later() {
        let client = |port: u16| {
            let settings = EtcdSettings::parse(
                &json!({"endpoints": [format!("127.0.0.1:{port}")], "timeout": 2}),
            )
            .unwrap();
            EtcdClient::new(settings).unwrap()
        };
        let page =
            answering(b"HTTP/1.1 404 Not Found\r\nContent-Length: 19\r\n\r\n404 page not found\n");
        let started = Instant::now();
        let error = client(page).get(b"k").unwrap_err();
        assert_eq!(error.code(), code::IO_FAILURE, "{error}");
        assert!(error.to_string().contains("(404)"), "{error}");
        assert!(error.to_string().contains("404 page not found"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(1), "not waited for");
        let proxy = answering(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 3\r\n\r\nbad");
        let error = client(proxy).get(b"k").unwrap_err();
        assert_eq!(error.code(), code::TRY_AGAIN_LATER, "{error}");
    }
}
