//! A client's connection to one server (an etcd member's JSON gateway, a
//! network controller's API), plain or TLS (with a client certificate),
//! kept alive from one request to the next, each bounded as a whole by a
//! deadline: the name's lookup, the connection, every read and write.

use std::io::{self, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::http::{self, Answer};

/// What an answer may be: a page of keys, or of ports, is far smaller
/// than its body's limit, and a larger one is a broken peer.
const LIMITS: http::Limits = http::Limits {
    line: 64 * 1024,
    headers: 128,
    body: 64 << 20,
};

/// A connection to one endpoint.
pub struct Connection {
    stream: BufReader<Stream>,
    /// The Host header's value: the host and its port.
    host: String,
}

/// The connection's stream, each read and write of it bounded by what is
/// left of the request's time, so that a peer that trickles its answer
/// cannot stretch a request past its deadline.
struct Stream {
    inner: Inner,
    deadline: Instant,
}

enum Inner {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        self.tcp()
            .set_read_timeout(Some(remaining(self.deadline)?))?;
        match &mut self.inner {
            Inner::Plain(stream) => stream.read(buffer),
            Inner::Tls(stream) => stream.read(buffer),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.tcp()
            .set_write_timeout(Some(remaining(self.deadline)?))?;
        match &mut self.inner {
            Inner::Plain(stream) => stream.write(bytes),
            Inner::Tls(stream) => stream.write(bytes),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.inner {
            Inner::Plain(stream) => stream.flush(),
            Inner::Tls(stream) => stream.flush(),
        }
    }
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match &self.inner {
            Inner::Plain(stream) => stream,
            Inner::Tls(stream) => stream.get_ref(),
        }
    }
}

impl Connection {
    /// Connects to `host:port` before `deadline`, through TLS when `tls`
    /// is given.
    pub fn open(
        host: &str,
        port: u16,
        tls: Option<&Arc<ClientConfig>>,
        deadline: Instant,
    ) -> io::Result<Connection> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
        let mut connected = None;
        for address in lookup(host, port, deadline)? {
            match TcpStream::connect_timeout(&address, remaining(deadline)?) {
                Ok(tcp) => {
                    connected = Some(tcp);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let tcp = connected.ok_or(last)?;
        tcp.set_nodelay(true)?;
        let inner = match tls {
            None => Inner::Plain(tcp),
            Some(config) => {
                let name = ServerName::try_from(host.to_owned())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let session =
                    ClientConnection::new(Arc::clone(config), name).map_err(io::Error::other)?;
                Inner::Tls(Box::new(StreamOwned::new(session, tcp)))
            }
        };
        Ok(Connection {
            stream: BufReader::new(Stream { inner, deadline }),
            // The Host header names the port, and brackets an IPv6 address.
            host: match host.contains(':') {
                true => format!("[{host}]:{port}"),
                false => format!("{host}:{port}"),
            },
        })
    }

    /// Sends a `method` request for `path`, with `headers` and a JSON
    /// `body` if one is given, and reads the answer before `deadline`.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        deadline: Instant,
    ) -> io::Result<Answer> {
        remaining(deadline)?;
        self.stream.get_mut().deadline = deadline;
        http::write_request(
            self.stream.get_mut(),
            method,
            &self.host,
            path,
            headers,
            body,
        )?;
        http::read_answer(&mut self.stream, LIMITS)
    }

    /// POSTs `body` to `path`, with `token` as its `Authorization` if one
    /// is given, and reads the answer before `deadline`: its status and
    /// its body.
    pub fn post(
        &mut self,
        path: &str,
        token: Option<&str>,
        body: &[u8],
        deadline: Instant,
    ) -> io::Result<(u16, Vec<u8>)> {
        let authorization: Vec<(&str, &str)> =
            token.map(|t| ("Authorization", t)).into_iter().collect();
        let answer = self.request("POST", path, &authorization, Some(body), deadline)?;
        Ok((answer.status, answer.body))
    }

    /// GETs `path` and reads the answer before `deadline`: its status and
    /// its body (the member's `/metrics`, say).
    pub fn get(&mut self, path: &str, deadline: Instant) -> io::Result<(u16, Vec<u8>)> {
        let answer = self.request("GET", path, &[], None, deadline)?;
        Ok((answer.status, answer.body))
    }
}

/// Whether `host:port` speaks the other scheme than the one tried
/// (`tried_tls`): plain HTTP when TLS was tried, TLS when plain HTTP was.
/// Asked, before `deadline`, of a member that closed a new connection
/// without a word, as one does a connection it cannot read: an endpoint
/// given with the wrong scheme is a setting to fix, not a member to wait
/// for.
pub fn speaks_the_other_scheme(host: &str, port: u16, tried_tls: bool, deadline: Instant) -> bool {
    if tried_tls {
        // Any HTTP answer at all is plain HTTP.
        return Connection::open(host, port, None, deadline)
            .and_then(|mut plain| plain.get("/version", deadline))
            .is_ok();
    }
    // No certificate is trusted: a member that sends one, or refuses the
    // hello with an alert, speaks TLS.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let Ok(builder) =
        ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions()
    else {
        return false;
    };
    let config = Arc::new(
        builder
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
    );
    let answer = Connection::open(host, port, Some(&config), deadline)
        .and_then(|mut tls| tls.get("/version", deadline));
    let Err(e) = answer else {
        return false;
    };
    matches!(
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>()),
        Some(rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_))
    )
}

/// The addresses of `host` (a name, or an address), looked up before
/// `deadline`: the system's resolver may wait far longer for a server
/// that does not answer, so a name is looked up in a thread of its own,
/// left to finish alone if it is late.
fn lookup(host: &str, port: u16, deadline: Instant) -> io::Result<Vec<SocketAddr>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let (answer, answered) = std::sync::mpsc::channel();
    let name = host.to_owned();
    std::thread::Builder::new()
        .name("http-lookup".into())
        .spawn(move || {
            let found = (name.as_str(), port)
                .to_socket_addrs()
                .map(Iterator::collect);
            // The caller may have gone on without it.
            let _ = answer.send(found);
        })?;
    answered
        .recv_timeout(remaining(deadline)?)
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("looking up {host} took longer than the time left"),
            ))
        })
}

/// The time left before `deadline`; none left is a timeout.
fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::Error::new(io::ErrorKind::TimedOut, "out of time"))
    } else {
        Ok(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::net::TcpListener;

    /// Serves one connection with the answers given, each after reading
    /// one request.
    fn server(answers: Vec<&'static [u8]>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut writer = stream;
            for answer in answers {
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = value.trim().parse().unwrap();
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                writer.write_all(answer).unwrap();
            }
        });
        port
    }

    #[test]
    fn answers_sized_by_length_or_chunked_on_one_connection() {
        let port = server(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n",
        ]);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut connection = Connection::open("127.0.0.1", port, None, deadline).unwrap();
        assert_eq!(
            connection
                .post("/v3/kv/range", None, b"{}", deadline)
                .unwrap(),
            (200, b"{}".to_vec())
        );
        let (status, body) = connection
            .post("/v3/kv/range", None, b"{\"k\":1}", deadline)
            .unwrap();
        assert_eq!((status, body.as_slice()), (503, &b"{\"a\":1}"[..]));
        // The peer has closed: the next request fails, it does not hang.
        assert!(connection
            .post("/v3/kv/range", None, b"{}", deadline)
            .is_err());
    }

    #[test]
    fn a_silent_peer_is_bounded_by_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let started = Instant::now();
        let deadline = started + Duration::from_millis(300);
        let mut connection = Connection::open("127.0.0.1", port, None, deadline).unwrap();
        let error = connection
            .post("/v3/kv/range", None, b"{}", deadline)
            .unwrap_err();
        assert!(
            matches!(
                error.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
        drop(listener);
    }

    #[test]
    fn a_peer_that_trickles_its_answer_is_bounded_by_the_deadline_as_a_whole() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0; 1024];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n");
            // A byte each 50 ms: every read gets one well within its time.
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(50));
                if stream.write_all(b" ").is_err() {
                    return;
                }
            }
        });
        let started = Instant::now();
        let deadline = started + Duration::from_millis(400);
        let mut connection = Connection::open("127.0.0.1", port, None, deadline).unwrap();
        assert!(connection
            .post("/v3/kv/range", None, b"{}", deadline)
            .is_err());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn an_address_needs_no_lookup_and_a_name_is_looked_up() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let found = lookup("127.0.0.1", 2379, deadline).unwrap();
        assert_eq!(found, ["127.0.0.1:2379".parse::<SocketAddr>().unwrap()]);
        let found = lookup("localhost", 2379, deadline).unwrap();
        assert!(found
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 2379));
    }
}
