//! A pod's ports that no ADD answered with: made by a POST that landed
//! after its ADD gave up, for a sandbox that the runtime has retried
//! since under another container ID (the kubelet does, and containerd
//! sends no GC). Each port says which pod it is for, where the runtime
//! says (a tag); a retried sandbox takes such a port over rather than
//! make a second, and the pod's DEL deletes those left. A port counts as
//! orphaned only when this node recorded no ADD answering with it and
//! its ADD has surely ended: older, by the controller's clock, than the
//! ADD's timeout and its undo's. A node that keeps no record of its
//! answers orphans nothing: it could not tell such a port from one in
//! use.

use super::api::{Controller, Port};
use super::error::NeutronError;
use super::ports::{self, Marks, OWNER};
use super::state::State;
use crate::cni::Environment;

/// The tag that says which pod a port is for, where the runtime says
/// (`K8S_POD_UID`, else `K8S_POD_NAMESPACE` and `K8S_POD_NAME`); a digest
/// of the pod's name where it would not fit a tag or a tag filter.
pub fn pod_tag(env: &Environment) -> Option<String> {
    let pairs = env.arg_pairs();
    let arg = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .filter(|v| !v.is_empty())
    };
    let pod = match (
        arg("K8S_POD_UID"),
        arg("K8S_POD_NAMESPACE"),
        arg("K8S_POD_NAME"),
    ) {
        (Some(uid), _, _) => uid.to_owned(),
        (None, Some(namespace), Some(name)) => format!("{namespace}/{name}"),
        _ => return None,
    };
    Some(format!("cni-pod={}", ports::tag_value(&pod)))
}

/// The ports of the pod `pod` tags, for interface `ifname` of the CNI
/// network `marks` name on this node, that no ADD answered with and
/// whose ADD has surely ended (older than twice `timeout`'s whole
/// seconds plus one), but for container `container`'s own.
pub fn of_pod(
    controller: &Controller,
    state: &State,
    marks: &Marks,
    pod: &str,
    ifname: &str,
    container: &str,
    timeout: std::time::Duration,
) -> Result<Vec<Port>, NeutronError> {
    if !state.keeps_answers() {
        return Ok(Vec::new());
    }
    let mut tags = marks.tags();
    tags.push(pod.to_owned());
    let listed = controller.ports(&[("device_owner", OWNER), ("tags", &tags.join(","))])?;
    // The controller's clock at the listing: an ADD and its undo each
    // take at most `timeout`, from before the POST.
    let now = controller.date().as_deref().and_then(super::age::http_date);
    let ended = timeout.as_secs().saturating_add(1).saturating_mul(2);
    // The listing kept only ports with every tag asked for (the pod's
    // among them), whatever the controller did with the filter.
    Ok(ports::ours(listed, marks.network)
        .into_iter()
        .filter(|(port, a)| a.container != container && a.ifname == ifname && marks.on(port))
        .filter(|(port, a)| {
            let answered = state.answered(marks.network, &a.container, &a.ifname);
            !answered.is_some_and(|ids| ids.contains(&port.id))
        })
        .filter(|(port, _)| {
            let created = port.created_at.as_deref().and_then(super::age::rfc3339);
            matches!((now, created), (Some(now), Some(created)) if created.saturating_add(ended) <= now)
        })
        .map(|(port, _)| port)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::add_with_args;

    #[test]
    fn a_pod_is_told_by_its_uid_else_its_name_and_always_fits_a_tag() {
        let tag = |args: &str| pod_tag(&add_with_args(args));
        let uid = "8c6f8a4e-5b3d-4f0e-9a7c-1d2e3f4a5b6c";
        assert_eq!(
            tag(&format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME=pg-0;K8S_POD_UID={uid}"
            )),
            Some(format!("cni-pod={uid}"))
        );
        assert_eq!(
            tag("K8S_POD_NAMESPACE=db;K8S_POD_NAME=pg-0"),
            Some("cni-pod=db/pg-0".into())
        );
        // No pod named: nothing to find a retried sandbox's port by.
        assert_eq!(tag("K8S_POD_NAMESPACE=db"), None);
        assert_eq!(tag("IP=10.0.0.2"), None);
        // A name too long for a tag, or one a tag filter would split.
        let long = tag(&format!(
            "K8S_POD_NAMESPACE=db;K8S_POD_NAME={}",
            "p".repeat(250)
        ))
        .unwrap();
        assert!(
            long.starts_with("cni-pod=sha256:") && long.len() < 60,
            "{long}"
        );
        let comma = tag("K8S_POD_UID=a,b").unwrap();
        assert!(comma.starts_with("cni-pod=sha256:"), "{comma}");
        assert_ne!(long, comma);
    }
}
