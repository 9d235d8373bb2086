//! A peer that trickles its answer: a TCP relay in front of one etcd
//! member, the first endpoint one node tries. It passes bytes through
//! as they come, until a fault asks it to trickle: then what the member
//! answers reaches the node a byte at a time, a byte every 100 ms, so
//! that a request through it outlasts any timeout while the connection
//! stays alive. The TLS inside is end to end, untouched.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The relay: where it listens, and whether it trickles.
pub struct Relay {
    /// Its port, on every address of this host.
    pub port: u16,
    trickling: Arc<AtomicBool>,
}

impl Relay {
    /// A relay to `127.0.0.1:member`, listening on `port` of every
    /// address, in threads of its own for as long as the run lasts.
    pub fn start(port: u16, member: u16) -> Relay {
        let listener = TcpListener::bind(("0.0.0.0", port)).expect("the relay's port");
        let trickling = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&trickling);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let flag = Arc::clone(&flag);
                std::thread::spawn(move || relay(client, member, &flag));
            }
        });
        Relay { port, trickling }
    }

    /// Starts (or stops) trickling the member's answers.
    pub fn trickle(&self, on: bool) {
        self.trickling.store(on, Ordering::SeqCst);
    }
}

/// Relays one connection both ways until either side closes it.
fn relay(client: TcpStream, member: u16, trickling: &AtomicBool) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", member)) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (Ok(mut client_in), Ok(mut server_out)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let upstream = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_in, &mut server_out);
        let _ = server_out.shutdown(Shutdown::Write);
    });
    let (mut server_in, mut client_out) = (server, client);
    let mut buffer = [0u8; 16 * 1024];
    loop {
        let n = match server_in.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let sent = if trickling.load(Ordering::SeqCst) {
            buffer[..n].iter().all(|byte| {
                std::thread::sleep(Duration::from_millis(100));
                client_out.write_all(&[*byte]).is_ok()
            })
        } else {
            client_out.write_all(&buffer[..n]).is_ok()
        };
        if !sent {
            break;
        }
    }
    let _ = client_out.shutdown(Shutdown::Both);
    let _ = upstream.join();
}
