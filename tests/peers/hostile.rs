//! Hostile peers: an answer far past its limit, pages whose links loop,
//! a token or a port ID that would split a request, a resolver that maps
//! `localhost` elsewhere; an etcd member that answers a search with the
//! same page again; and binaries that never dump core.

use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::common::etcd::encode;
use crate::common::{is_root, temp_dir, PORT_ALLOCATOR};
use crate::servers::{json_answer, Scripted};
use crate::{config, env, neutron_ipam, plain_pool_ipam, run, secret_file};

/// The most a run of ipam-da-neutron may take however large its peer's
/// answer: docs/performance.md gives the figure this bounds.
const PEAK_KIB: u64 = 80 * 1024;

/// A DEL of container c1 by ipam-da-neutron at `controller`, its data in
/// `data`.
fn del_at(controller: &Scripted, data: &crate::common::TempDir) -> crate::Run {
    let url = format!("http://127.0.0.1:{}/v2.0", controller.port());
    let ipam = neutron_ipam(&url, data.path(), json!({}));
    run(PORT_ALLOCATOR, &env("DEL", "c1"), &config(ipam, "DEL"))
}

#[test]
fn an_answer_of_60_mib_is_refused_within_the_stated_memory() {
    let data = temp_dir("peers-huge");
    // 60 MiB of ports, chunked, so that nothing says its size up front.
    let controller = Scripted::start(|_request, out| {
        let port = r#"{"id": "p", "name": "n", "device_id": "c1", "fixed_ips": [], "tags": ["cni-node=node-a"]},"#;
        let mut chunk = String::from("{\"ports\": [");
        while chunk.len() < 64 * 1024 {
            chunk.push_str(port);
        }
        let _ = write!(out, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        let mut sent = 0;
        while sent < 60 << 20 {
            if write!(out, "{:x}\r\n{chunk}\r\n", chunk.len()).is_err() {
                return;
            }
            sent += chunk.len();
            chunk = port.repeat(64 * 1024 / port.len());
        }
        let _ = write!(out, "1\r\n]\r\n0\r\n\r\n");
    });
    let out = del_at(&controller, &data);
    let error = out.outcome.assert_error(11);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("a body over 4194304 bytes"),
        "{error}"
    );
    assert!(
        out.peak_kib < PEAK_KIB,
        "peak {} KiB, over {PEAK_KIB}",
        out.peak_kib
    );
    eprintln!("a 60 MiB answer refused: peak RSS {} KiB", out.peak_kib);
}

use std::io::Write;

/// A controller that lists 15 pages of 4,000 ports each, just under
/// 4 MiB a page, each port with a description of `described` bytes; the
/// ports are this plugin's, on 60,000 nodes, if `ours`.
fn paging_controller(ours: bool, described: usize) -> Scripted {
    Scripted::start(move |request, out| {
        let page: usize = request
            .path
            .split("marker=")
            .nth(1)
            .and_then(|m| m.split('&').next()?.parse().ok())
            .unwrap_or(0);
        let owner = if ours {
            "cni:ipam-da-neutron"
        } else {
            "compute:nova"
        };
        let mut body = String::from("{\"ports\": [");
        for i in page * 4000..(page + 1) * 4000 {
            body.push_str(&format!(
                r#"{{"id": "port-{i}", "name": "peers/default/eth0", "network_id": "net-1", "device_id": "other-{i}", "device_owner": "{owner}", "description": "{}", "fixed_ips": [{{"subnet_id": "s", "ip_address": "10.{}.{}.{}"}}], "tags": ["cni-node=node-{i}", "cni-network=peers"]}},"#,
                "d".repeat(described),
                i / 62500,
                (i / 250) % 250,
                i % 250
            ));
        }
        body.pop();
        body.push_str("], \"ports_links\": [");
        if page < 14 {
            let here = request.host();
            body.push_str(&format!(
                r#"{{"rel": "next", "href": "http://{here}/v2.0/ports?device_owner=x&marker={}"}}"#,
                page + 1
            ));
        }
        body.push_str("]}");
        assert!(body.len() < 4 << 20, "{}", body.len());
        json_answer(out, "200 OK", &body);
    })
}

#[test]
fn the_largest_listings_allowed_are_read_within_the_stated_memory() {
    let data = temp_dir("peers-largest");
    // A DEL of a controller that ignores filters: 60,000 ports of others,
    // 56 MiB, none kept.
    let controller = paging_controller(false, 760);
    let url = format!("http://127.0.0.1:{}/v2.0", controller.port());
    let ipam = neutron_ipam(&url, data.path(), json!({}));
    let out = run(
        PORT_ALLOCATOR,
        &env("DEL", "c1"),
        &config(ipam.clone(), "DEL"),
    );
    out.outcome.assert_silent_success();
    assert_eq!(controller.requests().len(), 15);
    assert!(
        out.peak_kib < PEAK_KIB,
        "peak {} KiB, over {PEAK_KIB}",
        out.peak_kib
    );
    eprintln!(
        "DEL, 15 pages of others' ports: peak RSS {} KiB",
        out.peak_kib
    );
    // show, which keeps every node's ports of this plugin's.
    let file = data.path().join("peers.conf");
    let show = |controller: &Scripted| {
        let url = format!("http://127.0.0.1:{}/v2.0", controller.port());
        std::fs::write(
            &file,
            config(neutron_ipam(&url, data.path(), json!({})), "DEL"),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let child = crate::common::spawn_program(
            PORT_ALLOCATOR,
            std::path::Path::new("/"),
            &["show", "--config", file.to_str().unwrap(), "--json"],
            &crate::plain_env(),
            std::process::Stdio::piped(),
        );
        crate::finish(child, started)
    };
    // Ports of this plugin's with descriptions of 760 bytes: past the
    // bytes a listing keeps, refused.
    let out = show(&paging_controller(true, 760));
    assert!(!out.outcome.status.success());
    assert!(
        out.outcome.stderr.contains("bytes of them in one listing"),
        "{}",
        out.outcome.stderr
    );
    assert!(
        out.peak_kib < PEAK_KIB,
        "peak {} KiB, over {PEAK_KIB}",
        out.peak_kib
    );
    eprintln!(
        "show, refused past the bytes kept: peak RSS {} KiB",
        out.peak_kib
    );
}

#[test]
fn pages_whose_next_links_alternate_are_refused() {
    let data = temp_dir("peers-pages");
    let controller = Scripted::start(move |request, out| {
        let here = request.host();
        let next = if request.path.contains("marker=b") {
            "a"
        } else {
            "b"
        };
        let body = json!({
            "ports": [{"id": format!("p-{next}"), "device_id": "other"}],
            "ports_links": [{"rel": "next", "href": format!("http://{here}/v2.0/ports?device_id=c1&marker={next}")}],
        });
        json_answer(out, "200 OK", &body.to_string());
    });
    let out = del_at(&controller, &data);
    let error = out.outcome.assert_error(11);
    assert!(
        error["msg"].as_str().unwrap().contains("its links loop"),
        "{error}"
    );
    // The first page, then b, then a: a again is refused unread.
    assert_eq!(
        controller.requests().len(),
        3,
        "{:?}",
        controller.requests()
    );
    assert!(
        out.took < Duration::from_secs(crate::TIMEOUT),
        "{:?}",
        out.took
    );
}

#[test]
fn a_port_id_or_a_keystone_token_that_would_split_a_request_is_refused() {
    let data = temp_dir("peers-split");
    let controller = Scripted::start(|request, out| {
        if request.path.starts_with("/v3/auth/tokens") {
            let body = r#"{"token": {"expires_at": "2099-01-01T00:00:00.000000Z"}}"#;
            let _ = write!(
                out,
                "HTTP/1.1 201 Created\r\nX-Subject-Token: tok\rX-Injected: 1\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        } else {
            let body = json!({"ports": [{
                "id": "p\r\nX-Injected: 1", "device_id": "c1", "device_owner": "cni:ipam-da-neutron",
                "network_id": "net-1", "name": "peers/default/eth0",
            }]});
            json_answer(out, "200 OK", &body.to_string());
        }
    });
    let out = del_at(&controller, &data);
    let error = out.outcome.assert_error(11);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("port ID \"p\\r\\nX-Injected: 1\""),
        "{error}"
    );
    let secret = secret_file(&data, "secret", "s3cret\n");
    let auth = json!({"auth": {
        "url": format!("http://127.0.0.1:{}/v3", controller.port()),
        "applicationCredentialId": "cred-1",
        "secretFile": secret,
    }});
    let url = format!("http://127.0.0.1:{}/v2.0", controller.port());
    let ipam = neutron_ipam(&url, data.path(), auth);
    let out = run(PORT_ALLOCATOR, &env("DEL", "c1"), &config(ipam, "DEL"));
    let error = out.outcome.assert_error(11);
    let msg = error["msg"].as_str().unwrap();
    assert!(msg.contains("Keystone at http://127.0.0.1"), "{error}");
    assert!(msg.contains("control character"), "{error}");
    // Nothing the peers sent went out again: the port was not deleted,
    // the token never sent.
    let requests = controller.requests();
    assert!(
        requests
            .iter()
            .all(|r| !r.head.contains("X-Injected") && r.method != "DELETE"),
        "{requests:?}"
    );
}

#[test]
#[ignore = "needs root, for a mount namespace with its own /etc/hosts"]
fn localhost_is_the_loopback_whatever_the_hosts_file_says() {
    assert!(is_root());
    let data = temp_dir("peers-localhost");
    // The controller on 127.0.0.1; a decoy on 127.0.0.2, the same port,
    // where the hosts file sends localhost.
    let real = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = real.local_addr().unwrap().port();
    let decoy = TcpListener::bind(("127.0.0.2", port)).unwrap();
    let answer = |_: &crate::servers::Request, out: &mut dyn Write| {
        json_answer(out, "200 OK", r#"{"ports": []}"#)
    };
    let real = Scripted::start_on(real, answer);
    let decoy = Scripted::start_on(decoy, answer);
    let hosts = data.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.2 localhost\n").unwrap();
    let token = secret_file(&data, "token", "tok-1\n");
    let url = format!("http://localhost:{port}/v2.0");
    let ipam = neutron_ipam(&url, data.path(), json!({"tokenFile": token}));
    let script = format!(
        "mount --bind {} /etc/hosts && getent hosts localhost >&2 && exec {PORT_ALLOCATOR}",
        hosts.display()
    );
    let out = crate::common::run_program(
        "unshare",
        std::path::Path::new("/"),
        &["-m", "sh", "-c", &script],
        &env("DEL", "c1"),
        &config(ipam, "DEL"),
    );
    out.assert_silent_success();
    // The namespace's resolver did say 127.0.0.2.
    assert!(out.stderr.starts_with("127.0.0.2"), "{out:?}");
    assert_eq!(decoy.requests().len(), 0, "{:?}", decoy.requests());
    let requests = real.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.head.contains("X-Auth-Token: tok-1")),
        "{requests:?}"
    );
}

#[test]
#[ignore = "needs strace"]
fn no_binary_can_dump_core() {
    use crate::common::{ALLOCATOR, PLUGIN, SELECTOR};
    let docker = env!("CARGO_BIN_EXE_ipam-delegated-docker");
    let dir = temp_dir("peers-dumpable");
    for binary in [PLUGIN, SELECTOR, ALLOCATOR, PORT_ALLOCATOR, docker] {
        let trace = dir.path().join("trace");
        let out = crate::common::run_program(
            "strace",
            std::path::Path::new("/"),
            &[
                "-e",
                "trace=prctl",
                "-o",
                trace.to_str().unwrap(),
                binary,
                "--version",
            ],
            &crate::plain_env(),
            b"",
        );
        let traced = std::fs::read_to_string(&trace).unwrap_or_default();
        assert!(
            traced.contains("prctl(PR_SET_DUMPABLE, SUID_DUMP_DISABLE) = 0"),
            "{binary}: {traced} {out:?}"
        );
    }
}

/// The most a run of ipam-da-pool may take however large its etcd's
/// answer: docs/performance.md gives the figure this bounds.
const POOL_PEAK_KIB: u64 = 64 * 1024;

/// A gateway that answers every request with a range of `size` bytes,
/// chunked, of keys and values in base64.
fn etcd_answering(size: usize) -> Scripted {
    Scripted::start(move |_request, out| {
        let kv = format!(
            r#"{{"key":"L3BlZXJzL2tleQ==","value":"{}","mod_revision":"7"}},"#,
            "QUJD".repeat(512)
        );
        let _ = write!(out, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        // A transaction's ranges: what a DEL reads first.
        let head = "{\"succeeded\":true,\"responses\":[{\"response_range\":{\"kvs\":[";
        let _ = write!(out, "{:x}\r\n{head}\r\n", head.len());
        let chunk = kv.repeat(64 * 1024 / kv.len());
        let mut sent = head.len();
        while sent + chunk.len() + 2 < size {
            if write!(out, "{:x}\r\n{chunk}\r\n", chunk.len()).is_err() {
                return;
            }
            sent += chunk.len();
        }
        let last = format!("{}]}}}}]}}", kv.trim_end_matches(','));
        let _ = write!(out, "{:x}\r\n{last}\r\n0\r\n\r\n", last.len());
    })
}

#[test]
fn an_etcd_answer_of_60_mib_is_refused_and_the_largest_allowed_read_within_the_stated_memory() {
    let data = temp_dir("peers-read-limit");
    let ipam = |port: u16| {
        let mut ipam = plain_pool_ipam(&[format!("http://127.0.0.1:{port}")], data.path());
        ipam["pool"]["etcd"]["timeout"] = json!(10);
        ipam
    };
    let huge = etcd_answering(60 << 20);
    let out = run(
        crate::common::ALLOCATOR,
        &env("DEL", "c1"),
        &config(ipam(huge.port()), "DEL"),
    );
    let error = out.outcome.assert_error(11);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("a body over 16777216 bytes"),
        "{error}"
    );
    assert!(out.peak_kib < POOL_PEAK_KIB, "peak {} KiB", out.peak_kib);
    eprintln!(
        "a 60 MiB etcd answer refused: peak RSS {} KiB",
        out.peak_kib
    );
    // Just under the limit: read whole, whatever the allocator then makes
    // of records that are not its own.
    let largest = etcd_answering((16 << 20) - 4096);
    let out = run(
        crate::common::ALLOCATOR,
        &env("DEL", "c1"),
        &config(ipam(largest.port()), "DEL"),
    );
    // The DEL finds no record of its own among them: done.
    out.outcome.assert_silent_success();
    assert!(out.peak_kib < POOL_PEAK_KIB, "peak {} KiB", out.peak_kib);
    eprintln!(
        "a 16 MiB etcd answer read: peak RSS {} KiB, {:?} in {:?}: {:?}",
        out.peak_kib,
        out.outcome,
        out.took,
        largest
            .requests()
            .iter()
            .map(|r| r.path.clone())
            .collect::<Vec<_>>()
    );
}

#[test]
fn an_etcd_member_that_answers_a_search_with_the_same_page_again_is_refused() {
    // A full page of 256 keys between the addresses .1 and .2, none an
    // address, answered to every read of the search: the next page
    // would start where this one did, for ever.
    let page: Vec<_> = (0..256)
        .map(|i| {
            let key = format!("/peers/networks/peers/addresses/010.252.000.001/{i:03}");
            json!({"key": encode(key.as_bytes()), "mod_revision": "7"})
        })
        .collect();
    let page = json!({"kvs": page}).to_string();
    let searches = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&searches);
    let gateway = Scripted::start(move |request, out| {
        let search = request.body.contains("\"keys_only\":true");
        match request.path.as_str() {
            // Read ten times (a client that never stops): no more.
            "/v3/kv/range" if search && counted.fetch_add(1, Ordering::SeqCst) >= 10 => {
                json_answer(out, "500 Internal Server Error", "{}")
            }
            "/v3/kv/range" if search => json_answer(out, "200 OK", &page),
            // The attachment's record, in both places: none.
            "/v3/kv/txn" => json_answer(
                out,
                "200 OK",
                r#"{"succeeded":true,"responses":[{"response_range":{}},{"response_range":{}}]}"#,
            ),
            // The pool's definition, the fence, the hint: none.
            _ => json_answer(out, "200 OK", "{}"),
        }
    });
    let data = temp_dir("peers-searches");
    let ipam = plain_pool_ipam(
        &[format!("http://127.0.0.1:{}", gateway.port())],
        data.path(),
    );
    let out = run(
        crate::common::ALLOCATOR,
        &env("ADD", "c1"),
        &config(ipam, "ADD"),
    );
    // Refused, as any answer that breaks etcd's API is: asking again
    // would not mend it.
    let error = out.outcome.assert_error(5);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("refused a request (200): a page of keys outside the range asked for"),
        "{error}"
    );
    assert_eq!(searches.load(Ordering::SeqCst), 2, "the page, then again");
}
