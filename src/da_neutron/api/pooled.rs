//! The calls only the warm pool's keeper makes: ports made in bulk (the
//! port API's `{"ports": […]}`, all or none), a port's changes made only
//! if it is as read (`If-Match` on its revision), and a heartbeat port's
//! description written anew.

use serde_json::{json, Value};

use super::{wire, Controller, Port, Request};
use crate::da_neutron::error::NeutronError;

/// What a change made only if the port was as read came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Guarded {
    /// Changed: the port as it is now.
    Updated(Box<Port>),
    /// Deleted.
    Deleted,
    /// The port changed since it was read: nothing was done.
    Changed,
    /// The port is gone.
    Gone,
}

impl Controller {
    /// Creates the ports `bodies` describe (the members of each `port`),
    /// in one request: the controller makes all of them or none.
    pub fn create_ports(&self, bodies: &[Value], what: &str) -> Result<Vec<Port>, NeutronError> {
        let call = format!("creating {} ports at once", bodies.len());
        let answer = self.call("POST", "/ports", Some(&json!({ "ports": bodies })), &call)?;
        match answer.status {
            200 | 201 => {
                let made: wire::PortPage = self.read(&call, &answer)?;
                Ok(made.ports)
            }
            _ => Err(self.failure(&call, &answer, what)),
        }
    }

    /// Sets `members` (the port's own, not its tags) on `port` if it is
    /// unchanged since it was read.
    pub fn update_if(&self, port: &Port, members: &Value) -> Result<Guarded, NeutronError> {
        let call = format!("changing port {}", port.id);
        let body = json!({ "port": members });
        let path = format!("/ports/{}", port.id);
        let answer = self.guarded("PUT", &path, Some(&body), port, &call)?;
        match answer.status {
            200 => Ok(Guarded::Updated(Box::new(self.port_of(&call, &answer)?))),
            404 => Ok(Guarded::Gone),
            412 => Ok(Guarded::Changed),
            _ => Err(self.failure(&call, &answer, &format!("port {}", port.id))),
        }
    }

    /// Deletes `port` if it is unchanged since it was read.
    pub fn delete_if(&self, port: &Port) -> Result<Guarded, NeutronError> {
        let call = format!("deleting port {}", port.id);
        let path = format!("/ports/{}", port.id);
        let answer = self.guarded("DELETE", &path, None, port, &call)?;
        match answer.status {
            200 | 202 | 204 => Ok(Guarded::Deleted),
            404 => Ok(Guarded::Gone),
            412 => Ok(Guarded::Changed),
            _ => Err(self.failure(&call, &answer, &format!("port {}", port.id))),
        }
    }

    /// One request carrying `If-Match` on `port`'s revision, where the
    /// controller counts them (one that does not is trusted as read).
    fn guarded(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        port: &Port,
        call: &str,
    ) -> Result<crate::http::Answer, NeutronError> {
        let revision = port.revision_number.map(|r| format!("revision_number={r}"));
        let request = Request {
            method,
            path,
            body,
            if_match: revision.as_deref(),
        };
        self.call_if(&request, call)
    }
}
