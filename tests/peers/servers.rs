//! Peers that fail as wedged or hostile ones do, each on a loopback port
//! of its own and stopped with the test process: one whose kernel accepts
//! connections that its process never answers (a SIGSTOPped member, a
//! load balancer before a dead backend), a TLS server that trickles its
//! answer a byte at a time, and a plain HTTP server whose answers a test
//! writes, each request it read kept for the test to look at; and a port
//! where nothing listens.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};

use crate::common::etcd::Certificates;

/// A server that accepts connections and reads what comes, never
/// answering: to its clients, a wedged process behind a live kernel.
pub struct Silent {
    port: u16,
    received: Arc<AtomicUsize>,
}

impl Silent {
    pub fn start() -> Silent {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&received);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let counted = Arc::clone(&counted);
                std::thread::spawn(move || {
                    let mut buffer = [0; 4096];
                    while let Ok(read @ 1..) = stream.read(&mut buffer) {
                        counted.fetch_add(read, Ordering::SeqCst);
                    }
                });
            }
        });
        Silent { port, received }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// How many bytes its clients have sent: a TLS client's hello, say.
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

/// One request as a server read it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// The request line and the headers, as sent.
    pub head: String,
    /// The body, as text.
    pub body: String,
}

impl Request {
    /// Its Host header's value: where a link back to the server points.
    pub fn host(&self) -> &str {
        let after = self.head.split("Host: ").nth(1).unwrap_or("");
        after.lines().next().unwrap_or("").trim()
    }
}

/// What a scripted server answers a request with: it writes the whole
/// answer, status line first, on the connection.
pub type Script = dyn Fn(&Request, &mut dyn Write) + Send + Sync;

/// A plain HTTP server whose answers a test writes.
pub struct Scripted {
    port: u16,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Scripted {
    /// On a port of its own on 127.0.0.1.
    pub fn start(script: impl Fn(&Request, &mut dyn Write) + Send + Sync + 'static) -> Scripted {
        Scripted::start_on(TcpListener::bind("127.0.0.1:0").unwrap(), script)
    }

    /// On `listener`.
    pub fn start_on(
        listener: TcpListener,
        script: impl Fn(&Request, &mut dyn Write) + Send + Sync + 'static,
    ) -> Scripted {
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let kept = Arc::clone(&requests);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (script, kept) = (Arc::clone(&script), Arc::clone(&kept));
                std::thread::spawn(move || serve(stream, &*script, &kept));
            }
        });
        Scripted { port, requests }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Every request read so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

/// Answers the requests of one connection until it closes.
fn serve(stream: TcpStream, script: &Script, kept: &Mutex<Vec<Request>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    while let Some(request) = read_request(&mut reader) {
        kept.lock().unwrap().push(request.clone());
        script(&request, &mut writer);
        if writer.flush().is_err() {
            return;
        }
    }
}

/// A request's head, and its body read past; `None` once the peer closed.
fn read_request(reader: &mut impl BufRead) -> Option<Request> {
    let mut head = String::new();
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let mut words = head.split(' ');
    Some(Request {
        method: words.next()?.to_owned(),
        path: words.next()?.to_owned(),
        body: String::from_utf8_lossy(&body).into_owned(),
        head,
    })
}

/// An answer of `status` with a JSON `body` and the connection kept.
pub fn json_answer(out: &mut dyn Write, status: &str, body: &str) {
    let _ = write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
}

/// A loopback port nothing listens on: every connection to it is refused
/// at once (taken from a listener closed again).
pub fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A TLS server with the member certificate of `certificates` (for
/// 127.0.0.1) that completes the handshake, reads a request, and then
/// sends its answer as one TLS record, a byte of it each `every`: the
/// client's TLS reads the socket many times for that one record.
pub fn trickling_tls(certificates: &Certificates, every: Duration) -> u16 {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(certificates.file("member.pem"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
    let key = PrivateKeyDer::from_pem_file(certificates.file("member.key")).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = Arc::new(
        ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let config = Arc::clone(&config);
            std::thread::spawn(move || {
                let session = ServerConnection::new(config).unwrap();
                let mut reader = BufReader::new(StreamOwned::new(session, stream));
                if read_request(&mut reader).is_none() {
                    return;
                }
                let StreamOwned { mut conn, mut sock } = reader.into_inner();
                let answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
                conn.writer().write_all(answer).unwrap();
                let mut record = Vec::new();
                while conn.wants_write() {
                    conn.write_tls(&mut record).unwrap();
                }
                for byte in record {
                    if sock.write_all(&[byte]).is_err() {
                        return;
                    }
                    std::thread::sleep(every);
                }
            });
        }
    });
    port
}
