//! A loopback proxy between the plugin and the controller that passes
//! requests on whole and can hold the answer to a port's creation (the
//! port is made, and the plugin never hears of it) or to a listing (read
//! now, heard of later), until the test lets the answer go or drops it. It also counts the requests it passed, for
//! the round trips of a command; and it can make the controller one that
//! copies Neutron loosely: one that ignores list filters (Mizar-MP's
//! document says so of its own), one that answers a port's creation
//! before its addresses are filled, and one whose lists link their next
//! page under another root (Neutron's `network_link_prefix` set, or a
//! proxy that rewrites paths).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use serde_json::{json, Value};

/// The proxy's shared state.
#[derive(Default)]
struct Shared {
    /// Hold the answers to POSTs.
    hold_posts: AtomicBool,
    /// POST answers held now.
    held: Mutex<usize>,
    changed: Condvar,
    /// Let held answers go (true), or drop them with the connection.
    release: Mutex<Option<bool>>,
    requests: AtomicUsize,
    /// Drop every query string: listings come whole.
    ignore_filters: AtomicBool,
    /// Answer a port's creation with its addresses left out.
    blank_addresses: AtomicBool,
    /// Link a list's next page under `/elsewhere`.
    foreign_links: AtomicBool,
    /// Hold the answers to GETs whose request line has this.
    hold_gets: Mutex<Option<String>>,
}

/// A running proxy.
pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    /// A proxy to the server on loopback port `upstream`.
    pub fn to(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let accepted = Arc::clone(&shared);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let shared = Arc::clone(&accepted);
                std::thread::spawn(move || {
                    let _ = serve(client, upstream, &shared);
                });
            }
        });
        Proxy { port, shared }
    }

    /// The API's root through the proxy.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v2.0", self.port)
    }

    /// Holds every answer to a POST from now on.
    pub fn hold_posts(&self) {
        self.shared.hold_posts.store(true, Ordering::SeqCst);
    }

    /// Waits until the answer to a POST is held: the port is made.
    pub fn wait_for_held(&self) {
        let mut held = self.shared.held.lock().unwrap();
        while *held == 0 {
            held = self.shared.changed.wait(held).unwrap();
        }
    }

    /// Holds every answer to a GET whose request line (its query
    /// percent-encoded) has `text`, from now on.
    pub fn hold_gets_with(&self, text: &str) {
        *self.shared.hold_gets.lock().unwrap() = Some(text.to_owned());
    }

    /// Lets the held answers go, and holds no more.
    pub fn let_held_go(&self) {
        *self.shared.hold_gets.lock().unwrap() = None;
        *self.shared.release.lock().unwrap() = Some(true);
        self.shared.changed.notify_all();
    }

    /// Drops the held answers with their connections.
    pub fn drop_held(&self) {
        *self.shared.release.lock().unwrap() = Some(false);
        self.shared.changed.notify_all();
    }

    /// Lists everything, whatever the filters.
    pub fn ignore_filters(&self) {
        self.shared.ignore_filters.store(true, Ordering::SeqCst);
    }

    /// Answers each port's creation without its addresses.
    pub fn blank_addresses(&self) {
        self.shared.blank_addresses.store(true, Ordering::SeqCst);
    }

    /// Links each list's next page under `/elsewhere` from now on.
    pub fn foreign_links(&self) {
        self.shared.foreign_links.store(true, Ordering::SeqCst);
    }

    /// How many requests passed so far.
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }
}

/// Passes the requests of one client connection, one at a time, each on
/// a new connection upstream (whose answer says so: the client closes).
fn serve(client: TcpStream, upstream: u16, shared: &Shared) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut client = client;
    loop {
        let Some((head, body)) = read_message(&mut reader)? else {
            return Ok(());
        };
        shared.requests.fetch_add(1, Ordering::SeqCst);
        let post = head.starts_with("POST ");
        let mut head = head;
        if shared.ignore_filters.load(Ordering::SeqCst) {
            head = without_query(&head);
        }
        // Closed after the answer: the answer is read to its end.
        let head = head.replacen("\r\n", "\r\nConnection: close\r\n", 1);
        let mut server = TcpStream::connect(("127.0.0.1", upstream))?;
        server.write_all(head.as_bytes())?;
        server.write_all(&body)?;
        let mut answer = Vec::new();
        server.read_to_end(&mut answer)?;
        if post && shared.blank_addresses.load(Ordering::SeqCst) {
            answer = edited(&answer, |body| body["port"]["fixed_ips"] = json!([]));
        }
        if !post && shared.foreign_links.load(Ordering::SeqCst) {
            answer = edited(&answer, |body| {
                for link in body["ports_links"].as_array_mut().into_iter().flatten() {
                    let href = link["href"].as_str().unwrap_or_default();
                    link["href"] = json!(href.replacen("/v2.0/", "/elsewhere/v2.0/", 1));
                }
            });
        }
        let line = head.lines().next().unwrap_or_default().to_owned();
        let held_get = head.starts_with("GET ")
            && shared
                .hold_gets
                .lock()
                .unwrap()
                .as_deref()
                .is_some_and(|text| line.contains(text));
        if (post && shared.hold_posts.load(Ordering::SeqCst)) || held_get {
            *shared.held.lock().unwrap() += 1;
            shared.changed.notify_all();
            let mut release = shared.release.lock().unwrap();
            while release.is_none() {
                release = shared.changed.wait(release).unwrap();
            }
            if *release == Some(false) {
                return Ok(());
            }
        }
        client.write_all(&answer)?;
    }
}

/// A request's head with the query string of its request line dropped.
fn without_query(head: &str) -> String {
    let (line, rest) = head.split_once("\r\n").unwrap_or((head, ""));
    let mut words: Vec<&str> = line.split(' ').collect();
    if let Some(target) = words.get_mut(1) {
        *target = target.split('?').next().unwrap_or(target);
    }
    format!("{}\r\n{rest}", words.join(" "))
}

/// An answer (head and a body sized by its length) with its JSON body
/// changed by `edit`; one without a JSON body as it is.
fn edited(answer: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let Some(split) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return answer.to_vec();
    };
    let Ok(mut body) = serde_json::from_slice::<Value>(&answer[split + 4..]) else {
        return answer.to_vec();
    };
    edit(&mut body);
    let body = body.to_string();
    let head: Vec<String> = String::from_utf8_lossy(&answer[..split])
        .split("\r\n")
        .map(
            |line| match line.to_ascii_lowercase().starts_with("content-length:") {
                true => format!("Content-Length: {}", body.len()),
                false => line.to_owned(),
            },
        )
        .collect();
    format!("{}\r\n\r\n{body}", head.join("\r\n")).into_bytes()
}

/// A request's head (with its blank line) and body, sized by its length.
fn read_message(reader: &mut impl BufRead) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut head = String::new();
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        if line.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok(Some((head, body)))
}
