//! Keystone v3 application credentials (`ipam.neutron.auth`): a token
//! asked of Keystone for them, and kept under the data directory until a
//! minute before it expires, so that the common call costs Keystone
//! nothing; asked for again when the controller refuses it (revoked).

use std::sync::Arc;
use std::time::Instant;

use rustls::ClientConfig;
use serde_json::json;

use super::api::{message_of, transport_failure, ANSWERS};
use super::error::NeutronError;
use super::settings::{invalid, AppCredential};
use super::state::State;
use super::wire::TokenIssued;
use crate::http::client::Connection;

/// How long before its expiry a kept token is asked for again: a call
/// must not start with a token that ends on its way.
const RENEW_BEFORE: u64 = 60;

/// A token for `auth`: the kept one if it has more than a minute left
/// (unless `renew`), else a new one from Keystone, kept in `state`.
pub fn token(
    auth: &AppCredential,
    tls: Option<&Arc<ClientConfig>>,
    state: &State,
    deadline: Instant,
    renew: bool,
) -> Result<String, NeutronError> {
    let now = now();
    if !renew {
        if let Some((token, expires)) = state.keystone_token(&auth.id) {
            if expires > now + RENEW_BEFORE {
                return Ok(token);
            }
        }
    }
    let secret = crate::secret::read(&auth.secret_file)
        .map_err(|e| invalid(format!("\"ipam.neutron.auth.secretFile\": {e}")))?;
    let body = json!({"auth": {"identity": {
        "methods": ["application_credential"],
        "application_credential": {"id": auth.id, "secret": secret},
    }}});
    let peer = format!("Keystone at {}", auth.url);
    let call = format!(
        "asking Keystone for a token of application credential {}",
        auth.id
    );
    let timeout = deadline.saturating_duration_since(Instant::now());
    let unreachable = |e: std::io::Error| transport_failure(peer.clone(), &call, &e, timeout);
    let tls = tls.filter(|_| auth.url.tls);
    let mut connection = Connection::open(&auth.url.host, auth.url.port, tls, deadline, ANSWERS)
        .map_err(unreachable)?;
    let path = format!("{}/auth/tokens", auth.url.base);
    let headers = [("Accept", "application/json")];
    let body = body.to_string().into_bytes();
    let answer = connection
        .request("POST", &path, &headers, Some(&body), deadline)
        .map_err(unreachable)?;
    let (_, message) = message_of(&answer);
    let token = match answer.status {
        200 | 201 => answer.header("x-subject-token").map(String::from),
        401 | 403 => {
            return Err(NeutronError::Refused {
                peer,
                call,
                message,
            })
        }
        404 => {
            return Err(NeutronError::Missing {
                what: format!("application credential {}", auth.id),
                peer,
                message,
            })
        }
        500.. => {
            return Err(NeutronError::Unreachable {
                peer,
                call,
                reason: message,
            })
        }
        _ => {
            return Err(NeutronError::Rejected {
                peer,
                call,
                message,
            })
        }
    };
    let expires = serde_json::from_slice::<TokenIssued>(&answer.body)
        .ok()
        .and_then(TokenIssued::expires_at)
        .and_then(|at| super::age::rfc3339(&at));
    let (Some(token), Some(expires)) = (token, expires) else {
        return Err(NeutronError::Unreachable {
            peer,
            call,
            reason: "an answer without X-Subject-Token or token.expires_at".into(),
        });
    };
    // It goes into every request's X-Auth-Token: a line break there would
    // add headers, or a request, of Keystone's making.
    if token.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(NeutronError::Unreachable {
            peer,
            call,
            reason: "it answered a token (X-Subject-Token) that holds a space or a control character (a line break, a carriage return …): refused".into(),
        });
    }
    state.note_keystone_token(&auth.id, &token, expires);
    Ok(token)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
